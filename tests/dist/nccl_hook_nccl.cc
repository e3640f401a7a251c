// Built with the CUDA toolkit: the real NCCL factory.
#include "kiln/dist/nccl_comm.h"
#include "tests/dist/nccl_hook.h"

kiln::dist::BulkTransportFactory NcclFactoryOrNull() { return kiln::dist::NcclTransportFactory(); }
