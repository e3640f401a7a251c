// Built without the CUDA toolkit: no NCCL factory.
#include "tests/dist/nccl_hook.h"

kiln::dist::BulkTransportFactory NcclFactoryOrNull() { return {}; }
