// Runs a model holding lltm.LLTMSequence with no Python in the process, two
// ways: the AOTInductor package and the traced TorchScript module that
// make_artifacts.py wrote to DIR, on the input saved there, checked against
// the outputs eager PyTorch gave for it. Writes its outputs to
// DIR/cpp_outputs.pt: (AOTInductor's, TorchScript's), for torch.load.
//
//   lltm_example DIR [--skip-check]
//
// --skip-check: no lltm::check_operators(), to see what torch itself says
// when lltm is not loaded.
#include <lltm/lltm.h>
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>
#include <torch/script.h>
#include <torch/serialize.h>

#include <fstream>
#include <iostream>
#include <iterator>
#include <string>
#include <vector>

namespace {

c10::IValue read(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) throw std::runtime_error("cannot read " + path);
  return torch::pickle_load(
      std::vector<char>(std::istreambuf_iterator<char>(file), std::istreambuf_iterator<char>()));
}

// Whether `outputs` are eager's, within float32's tolerance; prints how far.
bool matches(const std::string& name, const std::vector<at::Tensor>& outputs,
             const std::vector<at::Tensor>& expected) {
  bool same = outputs.size() == expected.size();
  double worst = 0;
  for (size_t i = 0; same && i < outputs.size(); ++i) {
    same = outputs[i].sizes() == expected[i].sizes() &&
           at::allclose(outputs[i], expected[i], 1e-5, 1e-5);
    if (outputs[i].sizes() == expected[i].sizes())
      worst = std::max(worst, (outputs[i] - expected[i]).abs().max().item<double>());
  }
  std::cout << name << ": " << outputs.size() << " outputs, largest difference to eager " << worst
            << (same ? ": match" : ": MISMATCH") << std::endl;
  return same;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: " << argv[0] << " DIR [--skip-check]\n";
    return 2;
  }
  const std::string dir = argv[1];
  try {
    if (argc < 3 || std::string(argv[2]) != "--skip-check") lltm::check_operators();
    std::cout << "lltm's CUDA kernels: "
              << (lltm::missing_operators(c10::DeviceType::CUDA).empty() ? "loaded" : "not loaded")
              << std::endl;
    c10::InferenceMode inference;  // inference only: lltm's autograd is Python's
    const auto saved = read(dir + "/eager.pt").toGenericDict();
    const at::Tensor input = saved.at("input").toTensor();
    std::vector<at::Tensor> expected;
    for (const auto& output : saved.at("output").toListRef()) expected.push_back(output.toTensor());

    torch::inductor::AOTIModelPackageLoader package(dir + "/model.pt2");
    const std::vector<at::Tensor> compiled = package.run({input});

    torch::jit::Module traced = torch::jit::load(dir + "/traced.pt");
    const c10::IValue result = traced.forward({input});
    std::vector<at::Tensor> scripted;
    for (const auto& output : result.toTupleRef().elements()) scripted.push_back(output.toTensor());

    // ((AOTInductor's outputs), (TorchScript's)): tuples of tensors, which
    // torch.load reads with weights_only=True.
    const auto tuple = [](const std::vector<at::Tensor>& tensors) {
      return c10::ivalue::Tuple::create(std::vector<c10::IValue>(tensors.begin(), tensors.end()));
    };
    const auto bytes =
        torch::pickle_save(c10::ivalue::Tuple::create({tuple(compiled), tuple(scripted)}));
    std::ofstream(dir + "/cpp_outputs.pt", std::ios::binary).write(bytes.data(), bytes.size());

    // `&`, not `&&`: both say how close they came.
    const bool ok =
        matches("AOTInductor", compiled, expected) & matches("TorchScript", scripted, expected);
    return ok ? 0 : 1;
  } catch (const c10::Error& error) {  // torch's, without its C++ backtrace
    std::cerr << error.what_without_backtrace() << std::endl;
    return 1;
  } catch (const std::exception& error) {
    std::cerr << error.what() << std::endl;
    return 1;
  }
}
