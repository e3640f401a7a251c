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

// The element type of the INT8 primitives' quantized operands. s8 where oneDNN's integer products
// are exact: CPUs with VNNI (AVX2-VNNI, AVX-512 VNNI, AMX). Without VNNI (AVX2, AVX-512F) oneDNN
// multiplies u8 x s8 pairs with vpmaddubsw, whose 16-bit pair sums saturate (an s8 source is
// shifted to u8 by 128): measured on an AVX2 EPYC, relative L2 1e-2 to 2e-1 against the INT8
// contract. There the INT8 kernels hand oneDNN the same integers as f32 (activations q - zero
// point, weights q), which multiply and sum exactly below 2^24 and round as f32 above: the
// contract's results at f32 speed. KILN_CPU_INT8_F32=1 forces the f32 form (tests), =0 the s8.
dnnl::memory::data_type Int8ComputeType();

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
