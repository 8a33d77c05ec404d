"""Speculative decoding that keeps every bit: proposers (n-gram prompt lookup, a draft model), the
exact verifier, and the per-request and engine-wide back-off.

A speculating request's step forwards its last token and k proposed tokens as k + 1 rows; each row's
logits have the bits of the decode step that would have computed that position (the kernels are
batch-invariant, a row group of one request included), and the verifier samples them one position at a
time exactly as the plain path would, stopping at the first draw that differs from the proposal.
Modules: speculator (Speculator: what the engine's step drives, propose / verify / settle), ngram,
draft (DraftProposer), proposers (the Proposer interface), verifier (verify_run), adaptive (SpecBackoff),
footprint (a draft's config); the settings, SpecConfig, are in engine/settings.py.
"""
