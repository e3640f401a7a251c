// Built with NCCL: the real factory.
#include "kiln/distributed/nccl_comm.h"
#include "kiln/distributed/nccl_factory.h"

namespace kiln::distributed {

BulkTransportFactory NcclFactoryIfBuilt() { return NcclTransportFactory(); }

}  // namespace kiln::distributed
