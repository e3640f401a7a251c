// Conv/FusedConv geometry shared by the CPU conv tactics (conv.cc, conv_onednn.cc): attributes
// read once from the request, and concrete sizes resolved when shapes are known. 1-D convs are
// 2-D convs with height 1.
#pragma once

#include <optional>

#include "kiln/backends/kernel.h"
#include "kiln/ops/fused.h"
#include "kiln/ops/nn.h"

namespace kiln::cpu {

struct ConvSpec {
  nn::WindowAttrs attrs;
  FusedActivationSpec act;  // FusedConv only; none for Conv
  size_t spatial_rank = 2;
};

struct ConvGeometry {
  int64_t n = 0, group = 1, cg = 0, mg = 0;  // batch, groups, in/out channels per group
  int64_t ih = 1, iw = 1, oh = 1, ow = 1;
  int64_t kh = 1, kw = 1, sh = 1, sw = 1, dh = 1, dw = 1;
  int64_t ph = 0, pw = 0, pad_h_end = 0, pad_w_end = 0;
};

// Reads and validates the node's attributes for convolutions of min_spatial..max_spatial axes
// (an error for other ranks): 1-D and 2-D by default (conv.cc, conv_onednn.cc); conv3d.cc asks
// for 3-D.
StatusOr<ConvSpec> ReadConvSpec(const KernelRequest& request, size_t min_spatial = 1,
                                size_t max_spatial = 2);
// Concrete geometry from X, W and Y dims; checks that Y has the shape the attributes imply.
StatusOr<ConvGeometry> ResolveConvGeometry(const ConvSpec& spec, std::span<const int64_t> x,
                                           std::span<const int64_t> w, std::span<const int64_t> y);
// Geometry at the request's largest shapes (for workspace estimates).
StatusOr<ConvGeometry> MaxConvGeometry(const ConvSpec& spec, const KernelRequest& request);
// The largest dims an operand will have: max_dims, else its static shape; empty if unknown.
std::vector<int64_t> MaxDimsOf(const OperandDesc& operand);

// oneDNN's convolution as a tactic (conv_onednn.cc); nullopt where it does not apply.
std::optional<TacticConfig> OneDnnConvTactic(const ConvSpec& spec, const ConvGeometry& max_geo);
StatusOr<std::unique_ptr<Kernel>> CreateOneDnnConv(const KernelRequest& request,
                                                   const ConvSpec& spec);

}  // namespace kiln::cpu
