"""The KV block pool: fixed-size blocks, block tables, reference counts, prefix hashes."""
