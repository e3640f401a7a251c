// What the CPU backend's oneDNN kernels share (conv_onednn.cc, the INT8 kernels): the process's
// oneDNN engine, the fused activation as an eltwise post-op, and OpenMP's thread count.
#pragma once

#include <dnnl.hpp>

#include <optional>

#include "kiln/backends/cpu/conv_common.h"
#include "kiln/ops/fused.h"

namespace kiln::cpu {

// The one CPU engine every oneDNN kernel uses (created on first use, never destroyed).
dnnl::engine& OneDnnEngine();

// The activation as a oneDNN eltwise algorithm with its alpha/beta; nullopt for none.
std::optional<dnnl::algorithm> OneDnnEltwise(const FusedActivationSpec& act, float* alpha,
                                             float* beta);

// A convolution's shapes as oneDNN takes them: N,C,H,W activations and O,I,H,W (grouped:
// G,O,I,H,W) weights, 1-D convolutions without the unit height; oneDNN's dilations are ONNX's
// minus one. The tags are the plain (ONNX) layouts of kiln's own buffers.
struct OneDnnConvShapes {
  dnnl::memory::dims src, dst, wei, strides, dilation, pad_l, pad_r;
  dnnl::memory::format_tag act_tag, wei_tag;
};
OneDnnConvShapes MakeOneDnnConvShapes(const ConvSpec& spec, const ConvGeometry& g);

// Debian's oneDNN runs on OpenMP's threads, not kiln's ThreadPool: bound them by the pool's size
// (KILN_NUM_THREADS) on the calling thread before executing a primitive.
void SetOneDnnThreads();

// One OpenMP thread on the calling thread while in scope (the previous count is restored after).
// For the one-off work of Prepare (packing weights): an OpenMP parallel region needs every team
// thread at its barrier, and on a loaded machine a descheduled team thread costs the caller a
// scheduler tick per region (measured: mobilenetv3_tiny's 83 layers took 0.3-0.8 s to prepare on
// 2 busy cores, 10 ms single-threaded).
class OneDnnSingleThreadScope {
 public:
  OneDnnSingleThreadScope();
  ~OneDnnSingleThreadScope();
  OneDnnSingleThreadScope(const OneDnnSingleThreadScope&) = delete;
  OneDnnSingleThreadScope& operator=(const OneDnnSingleThreadScope&) = delete;

 private:
  int previous_;
};

}  // namespace kiln::cpu
