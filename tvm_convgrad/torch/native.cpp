// The drop-in's autograd node in C++ (tvm_convgrad/torch/native.py builds and loads it).
//
// A convolution whose gradients are the package's kernels, settled for its signature, runs its
// backward here: the dW kernel, then the dX kernel, called through tvm-ffi's C ABI on the saved
// tensors' memory, and grad_output's sum for the bias; the autograd engine never enters Python.
// A backward that must record a graph (create_graph=True), or whose grad_output is batched or
// wrapped, calls the Python fallback registered with set_fallback (the Python node's backward).

#include <torch/extension.h>
#include <tvm/ffi/c_api.h>

#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

#ifndef TVM_CONVGRAD_ALIGNMENT
#error "native.py defines TVM_CONVGRAD_ALIGNMENT (tvm_convgrad.torch.kernels.ALIGNMENT)"
#endif
constexpr int64_t kAlignment = TVM_CONVGRAD_ALIGNMENT;  // bytes the kernels' loads take a tensor's data to start on

// One signature's backward: its two kernels (tvm-ffi Function handles) and layouts.
struct Plan {
  int64_t input_grad;   // (grad_output, weight) -> grad_input
  int64_t weight_grad;  // (input, grad_output) -> grad_weight
  bool channels_last;   // activations NHWC in memory (NXC), else NCHW (NCX)
  bool weights_last;    // weights OHWI in memory (OXI), else OIHW (OIX)
};

std::mutex plans_lock;
std::vector<Plan> plans;  // registered from Python, never removed: a plan's id is its index
// (plan id, grad_output, input, weight, needs) -> (dX, dW, db); never destroyed (no GIL at exit)
py::object* fallback = nullptr;

Plan plan_of(int64_t id) {
  std::lock_guard<std::mutex> guard(plans_lock);
  return plans.at(static_cast<size_t>(id));
}

at::MemoryFormat layout(bool last) { return last ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous; }

// t contiguous in its layout, its data 64-byte aligned (a copy where it is not both).
at::Tensor aligned(const at::Tensor& t, bool last) {
  at::Tensor dense = t.contiguous(layout(last));
  if (reinterpret_cast<uintptr_t>(dense.data_ptr()) % kAlignment == 0) return dense;
  return dense.clone(layout(last));
}

// Whether the kernels may read t's memory as it lies: a dense CPU tensor of its own storage, no
// functorch or legacy-vmap wrapper, no Python subclass or dispatch mode, no lazy sign or conjugate
// bit (the Python node's ``ops.eager`` test on the backward's grad_output).
bool plain(const at::Tensor& t) {
  constexpr c10::DispatchKeySet wrapped({c10::DispatchKey::Python, c10::DispatchKey::PythonTLSSnapshot, c10::DispatchKey::Batched,
                                         c10::DispatchKey::FuncTorchBatched, c10::DispatchKey::FuncTorchGradWrapper});
  return t.defined() && t.has_storage() && t.layout() == at::kStrided && t.device().is_cpu() && !t.is_neg() && !t.is_conj() &&
         !t.key_set().has_any(wrapped) && c10::impl::TorchDispatchModeTLS::stack_len() == 0;
}

DLDataType dl_type(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat: return DLDataType{kDLFloat, 32, 1};
    case at::kBFloat16: return DLDataType{kDLBfloat, 16, 1};
    case at::kHalf: return DLDataType{kDLFloat, 16, 1};
    default: throw std::invalid_argument("tvm_convgrad native: a tensor type the kernels do not take");
  }
}

// A compact DLTensor over a 4-D tensor's memory, its dimensions in memory order (NHWC / OHWI where last).
struct View {
  int64_t shape[4];
  DLTensor tensor;
  View(const at::Tensor& t, bool last) {
    const int64_t order_last[4] = {0, 2, 3, 1}, order_first[4] = {0, 1, 2, 3};
    for (int i = 0; i < 4; ++i) shape[i] = t.size(last ? order_last[i] : order_first[i]);
    tensor = DLTensor{t.data_ptr(), DLDevice{kDLCPU, 0}, 4, dl_type(t), shape, nullptr, 0};
  }
};

void call(int64_t function, const View& a, const View& b, const View& out, const char* name) {
  RECORD_FUNCTION(name, std::vector<c10::IValue>());
  TVMFFIAny args[3], result;
  const View* views[3] = {&a, &b, &out};
  for (int i = 0; i < 3; ++i) {
    args[i].type_index = kTVMFFIDLTensorPtr;
    args[i].zero_padding = 0;
    args[i].v_ptr = const_cast<DLTensor*>(&views[i]->tensor);
  }
  result.type_index = kTVMFFINone;
  result.zero_padding = 0;
  result.v_int64 = 0;
  if (TVMFFIFunctionCall(reinterpret_cast<TVMFFIObjectHandle>(function), args, 3, &result) != 0) {
    TVMFFIObjectHandle error = nullptr;
    TVMFFIErrorMoveFromRaised(&error);
    if (error != nullptr) TVMFFIObjectDecRef(error);
    throw std::runtime_error(std::string("tvm_convgrad native: kernel ") + name + " failed");
  }
}

struct Conv2dNative : public torch::autograd::Function<Conv2dNative> {
  // ``output()``: the caller's forward (Python, called with the GIL the caller holds), run here
  // without recording a graph; the node records the gradients' edges and saves what the backward reads.
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input, const at::Tensor& weight,
                            const c10::optional<at::Tensor>& bias, const py::object& output, int64_t plan) {
    ctx->save_for_backward({input, weight});
    ctx->saved_data["plan"] = plan;
    ctx->saved_data["bias"] = bias.has_value() && bias->defined();
    return output().cast<at::Tensor>();
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const at::Tensor& input = saved[0];
    const at::Tensor& weight = saved[1];
    const int64_t id = ctx->saved_data["plan"].toInt();
    const bool need_x = ctx->needs_input_grad(0), need_w = ctx->needs_input_grad(1);
    const bool need_b = ctx->saved_data["bias"].toBool() && ctx->needs_input_grad(2);  // (no edge without a bias)
    at::Tensor grad_input, grad_weight, grad_bias;
    const Plan plan = plan_of(id);
    const bool kernels = (!need_x || plan.input_grad != 0) && (!need_w || plan.weight_grad != 0);
    if (at::GradMode::is_enabled() || !plain(grads[0]) || !kernels) {  // create_graph=True, a batched or wrapped grad_output
      py::gil_scoped_acquire gil;
      auto got = (*fallback)(id, grads[0], input, weight, py::make_tuple(need_x, need_w, need_b)).cast<py::tuple>();
      grad_input = got[0].is_none() ? at::Tensor() : got[0].cast<at::Tensor>();
      grad_weight = got[1].is_none() ? at::Tensor() : got[1].cast<at::Tensor>();
      grad_bias = got[2].is_none() ? at::Tensor() : got[2].cast<at::Tensor>();
      return {grad_input, grad_weight, grad_bias, at::Tensor(), at::Tensor()};
    }
    at::Tensor dy = grads[0].scalar_type() == input.scalar_type() ? grads[0] : grads[0].to(input.scalar_type());
    dy = aligned(dy, plan.channels_last);
    const View dy_view(dy, plan.channels_last);
    if (need_w) {  // dW first: dX, read next, is left in cache
      grad_weight = at::empty(weight.sizes(), weight.options().memory_format(layout(plan.weights_last)));
      call(plan.weight_grad, View(aligned(input, plan.channels_last), plan.channels_last), dy_view,
           View(grad_weight, plan.weights_last), "tvm_convgrad::conv2d_weight_grad");
    }
    if (need_x) {
      grad_input = at::empty(input.sizes(), input.options().memory_format(layout(plan.channels_last)));
      call(plan.input_grad, dy_view, View(aligned(weight, plan.weights_last), plan.weights_last),
           View(grad_input, plan.channels_last), "tvm_convgrad::conv2d_input_grad");
    }
    if (need_b) grad_bias = grads[0].sum({0, 2, 3});
    return {grad_input, grad_weight, grad_bias, at::Tensor(), at::Tensor()};
  }
};

at::Tensor apply(const at::Tensor& input, const at::Tensor& weight, const c10::optional<at::Tensor>& bias,
                 const py::object& output, int64_t plan) {
  return Conv2dNative::apply(input, weight, bias, output, plan);
}

int64_t add_plan(bool channels_last, bool weights_last) {
  std::lock_guard<std::mutex> guard(plans_lock);
  plans.push_back(Plan{0, 0, channels_last, weights_last});
  return static_cast<int64_t>(plans.size()) - 1;
}

void set_kernel(int64_t id, bool input_grad, int64_t function) {
  std::lock_guard<std::mutex> guard(plans_lock);
  Plan& plan = plans.at(static_cast<size_t>(id));
  (input_grad ? plan.input_grad : plan.weight_grad) = function;
}

void set_fallback(py::object function) {
  if (fallback == nullptr) fallback = new py::object();
  *fallback = std::move(function);
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("apply", &apply, "the convolution's node: (input, weight, bias, forward, plan id) -> forward()");
  m.def("add_plan", &add_plan, "register a signature's layouts: (channels_last, weights_last) -> id");
  m.def("set_kernel", &set_kernel, "a registered signature's dX (input_grad) or dW kernel: (id, input_grad, handle)");
  m.def("set_fallback", &set_fallback, "the Python backward of a node that records a graph");
}
