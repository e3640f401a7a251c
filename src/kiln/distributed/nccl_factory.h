// The NCCL bulk-transport factory for BuildOnce, where this kiln was built with NCCL: the one
// place that knows, so the CLI and the test drivers need no conditional code of their own.
#pragma once

#include "kiln/distributed/build_once.h"

namespace kiln::distributed {

// NcclTransportFactory() in a kiln built with the CUDA toolkit's NCCL (target kiln_distributed_nccl);
// an empty factory otherwise, for which BuildOnce reports KILN-E7015 on --transport nccl.
BulkTransportFactory NcclFactoryIfBuilt();

}  // namespace kiln::distributed
