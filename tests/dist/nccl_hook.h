// The driver's NCCL bulk-transport factory: real when kiln_dist_nccl was built, empty otherwise
// (BuildOnce then reports KILN-E7015 for --transport nccl).
#pragma once

#include "kiln/dist/build_once.h"

kiln::dist::BulkTransportFactory NcclFactoryOrNull();
