// Built with NCCL: the real factory.
#include "kiln/dist/nccl_comm.h"
#include "kiln/dist/nccl_factory.h"

namespace kiln::dist {

BulkTransportFactory NcclFactoryIfBuilt() { return NcclTransportFactory(); }

}  // namespace kiln::dist
