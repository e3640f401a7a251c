// The ONNX backend node tests (onnx's own inputs and expected outputs) for the nn and matmul ops,
// run through every CPU tactic. The data ships with the onnx Python package that
// scripts/python_env.sh installs into .venv; the test skips when it is absent.
#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include "nn_test_util.h"

namespace kiln::testing {
namespace {

namespace fs = std::filesystem;

fs::path NodeDataRoot() {
  if (const char* env = std::getenv("KILN_ONNX_NODE_DATA")) return env;
  const char* src = std::getenv("KILN_SOURCE_DIR");
  fs::path venv = fs::path(src ? src : ".") / ".venv" / "lib";
  std::error_code ec;
  if (fs::is_directory(venv, ec)) {
    for (const auto& e : fs::directory_iterator(venv, ec)) {
      fs::path p = e.path() / "site-packages/onnx/backend/test/data/node";
      if (fs::is_directory(p, ec)) return p;
    }
  }
  return {};
}

template <typename Proto>
bool ReadProto(const fs::path& path, Proto* out) {
  std::ifstream f(path, std::ios::binary);
  return f && out->ParseFromIstream(&f);
}

Tensor FromProto(const onnx::TensorProto& t) {
  std::vector<int64_t> dims(t.dims().begin(), t.dims().end());
  if (t.data_type() == onnx::TensorProto::INT64) {
    std::vector<int64_t> v(t.int64_data().begin(), t.int64_data().end());
    if (!t.raw_data().empty()) {
      v.resize(t.raw_data().size() / 8);
      std::memcpy(v.data(), t.raw_data().data(), t.raw_data().size());
    }
    return Tensor::FromVector(DataType::kInt64, dims, v);
  }
  std::vector<float> v(t.float_data().begin(), t.float_data().end());
  if (!t.raw_data().empty()) {
    v.resize(t.raw_data().size() / 4);
    std::memcpy(v.data(), t.raw_data().data(), t.raw_data().size());
  }
  return Tensor::FromVector(DataType::kFloat32, dims, v);
}

// Runs one node test directory through every tactic of the op.
void RunNodeTest(const std::string& name) {
  fs::path root = NodeDataRoot();
  if (root.empty() || !fs::is_directory(root / name)) {
    GTEST_SKIP() << "ONNX node test data not found (run scripts/python_env.sh or set "
                    "KILN_ONNX_NODE_DATA)";
  }
  onnx::ModelProto model;
  ASSERT_TRUE(ReadProto(root / name / "model.onnx", &model)) << name;
  const onnx::NodeProto& node = model.graph().node(0);
  OpCase c;
  c.op = node.op_type();
  for (const auto& a : node.attribute()) {
    switch (a.type()) {
      case onnx::AttributeProto::INT:
        c.attrs.Set(a.name(), static_cast<int64_t>(a.i()));
        break;
      case onnx::AttributeProto::FLOAT:
        c.attrs.Set(a.name(), a.f());
        break;
      case onnx::AttributeProto::STRING:
        c.attrs.Set(a.name(), a.s());
        break;
      case onnx::AttributeProto::INTS:
        c.attrs.Set(a.name(), std::vector<int64_t>(a.ints().begin(), a.ints().end()));
        break;
      case onnx::AttributeProto::FLOATS:
        c.attrs.Set(a.name(), std::vector<float>(a.floats().begin(), a.floats().end()));
        break;
      default:
        FAIL() << name << ": attribute kind of " << a.name();
    }
  }
  // Graph inputs in order map to input_<i>.pb.
  std::map<std::string, int> input_index;
  for (int i = 0; i < model.graph().input_size(); ++i) {
    input_index[model.graph().input(i).name()] = i;
  }
  fs::path data = root / name / "test_data_set_0";
  for (int i = 0; i < node.input_size(); ++i) {
    if (node.input(i).empty()) {
      c.inputs.emplace_back();
      c.constant.push_back(false);
      continue;
    }
    onnx::TensorProto t;
    ASSERT_TRUE(ReadProto(data / fmt::format("input_{}.pb", input_index[node.input(i)]), &t));
    c.inputs.push_back(FromProto(t));
    c.constant.push_back(i > 0);  // weights, scales and sizes are constants in real models
  }
  onnx::TensorProto expected_proto;
  ASSERT_TRUE(ReadProto(data / "output_0.pb", &expected_proto));
  Tensor expected = FromProto(expected_proto);
  auto reference = [&](const std::vector<Tensor>&, const std::vector<int64_t>& out_dims) {
    EXPECT_EQ(out_dims, expected.dims()) << name;
    std::vector<double> v;
    for (int64_t i = 0; i < expected.num_elements(); ++i) v.push_back(expected.GetDouble(i));
    return v;
  };
  auto results = CheckAllTactics(c, reference, 1e-4, 1e-4);
  EXPECT_FALSE(results.empty()) << name;
}

class OnnxNodeTest : public ::testing::TestWithParam<std::string> {};

TEST_P(OnnxNodeTest, MatchesOnnxExpectedOutput) { RunNodeTest(GetParam()); }

INSTANTIATE_TEST_SUITE_P(
    NnAndMatmul, OnnxNodeTest,
    ::testing::Values(
        "test_averagepool_1d_default", "test_averagepool_2d_ceil",
        "test_averagepool_2d_ceil_last_window_starts_on_pad", "test_averagepool_2d_default",
        "test_averagepool_2d_dilations", "test_averagepool_2d_pads",
        "test_averagepool_2d_pads_count_include_pad", "test_averagepool_2d_precomputed_pads",
        "test_averagepool_2d_precomputed_pads_count_include_pad",
        "test_averagepool_2d_precomputed_same_upper", "test_averagepool_2d_precomputed_strides",
        "test_averagepool_2d_same_lower", "test_averagepool_2d_same_upper",
        "test_averagepool_2d_strides", "test_batchnorm_epsilon", "test_batchnorm_example",
        "test_conv_with_autopad_same", "test_conv_with_strides_and_asymmetric_padding",
        "test_conv_with_strides_no_padding", "test_conv_with_strides_padding", "test_convtranspose",
        "test_convtranspose_1d", "test_convtranspose_autopad_same", "test_convtranspose_dilations",
        "test_convtranspose_group_2", "test_convtranspose_group_2_image_3",
        "test_convtranspose_kernel_shape", "test_convtranspose_output_shape",
        "test_convtranspose_pad", "test_convtranspose_pads", "test_gemm_all_attributes",
        "test_gemm_alpha", "test_gemm_beta", "test_gemm_default_matrix_bias",
        "test_gemm_default_no_bias", "test_gemm_default_scalar_bias",
        "test_gemm_default_single_elem_vector_bias", "test_gemm_default_vector_bias",
        "test_gemm_default_zero_bias", "test_gemm_transposeA", "test_gemm_transposeB",
        "test_globalaveragepool", "test_globalaveragepool_precomputed", "test_globalmaxpool",
        "test_globalmaxpool_precomputed", "test_matmul_1d_1d", "test_matmul_1d_3d",
        "test_matmul_2d", "test_matmul_3d", "test_matmul_4d", "test_matmul_4d_1d",
        "test_matmul_bcast", "test_maxpool_1d_default", "test_maxpool_2d_ceil",
        "test_maxpool_2d_ceil_output_size_reduce_by_one", "test_maxpool_2d_default",
        "test_maxpool_2d_dilations", "test_maxpool_2d_pads", "test_maxpool_2d_precomputed_pads",
        "test_maxpool_2d_precomputed_same_upper", "test_maxpool_2d_precomputed_strides",
        "test_maxpool_2d_same_lower", "test_maxpool_2d_same_upper", "test_maxpool_2d_strides",
        "test_resize_downsample_scales_cubic",
        "test_resize_downsample_scales_cubic_A_n0p5_exclude_outside",
        "test_resize_downsample_scales_cubic_align_corners", "test_resize_downsample_scales_linear",
        "test_resize_downsample_scales_linear_align_corners",
        "test_resize_downsample_scales_linear_half_pixel_symmetric",
        "test_resize_downsample_scales_nearest", "test_resize_downsample_sizes_cubic",
        "test_resize_downsample_sizes_linear_pytorch_half_pixel",
        "test_resize_downsample_sizes_nearest", "test_resize_downsample_sizes_nearest_not_larger",
        "test_resize_downsample_sizes_nearest_not_smaller", "test_resize_upsample_scales_cubic",
        "test_resize_upsample_scales_cubic_A_n0p5_exclude_outside",
        "test_resize_upsample_scales_cubic_align_corners",
        "test_resize_upsample_scales_cubic_asymmetric", "test_resize_upsample_scales_linear",
        "test_resize_upsample_scales_linear_align_corners",
        "test_resize_upsample_scales_linear_half_pixel_symmetric",
        "test_resize_upsample_scales_nearest", "test_resize_upsample_scales_nearest_axes_2_3",
        "test_resize_upsample_scales_nearest_axes_3_2", "test_resize_upsample_sizes_cubic",
        "test_resize_upsample_sizes_nearest", "test_resize_upsample_sizes_nearest_axes_2_3",
        "test_resize_upsample_sizes_nearest_axes_3_2",
        "test_resize_upsample_sizes_nearest_ceil_half_pixel",
        "test_resize_upsample_sizes_nearest_floor_align_corners",
        "test_resize_upsample_sizes_nearest_not_larger",
        "test_resize_upsample_sizes_nearest_not_smaller",
        "test_resize_upsample_sizes_nearest_round_prefer_ceil_asymmetric"),
    [](const ::testing::TestParamInfo<std::string>& info) { return info.param.substr(5); });

}  // namespace
}  // namespace kiln::testing
