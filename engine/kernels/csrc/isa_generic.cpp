// The portable instantiation: scalar lanes, any CPU the compiler targets.
#include "table.h"

namespace nxk {
KernelTable generic_table() { return make_table<GenericVec>("generic"); }
}  // namespace nxk
