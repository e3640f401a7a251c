// Built without NCCL: no factory.
#include "kiln/distributed/nccl_factory.h"

namespace kiln::distributed {

BulkTransportFactory NcclFactoryIfBuilt() { return {}; }

}  // namespace kiln::distributed
