// The drop-in's autograd node in C++ (tvm_convgrad/torch/native.py builds and loads it).
//
// A convolution whose gradients are the package's kernels, settled for its signature, runs its
// backward here: the dW kernel, then the dX kernel (a depthwise or 1x1 layer's: one kernel of both),
// called through tvm-ffi's C ABI on the saved tensors' memory, and grad_output's sum for the
// bias; the autograd engine never enters Python.
// A backward that must record a graph (create_graph=True), or whose grad_output is batched or
// wrapped, calls the Python fallback registered with set_fallback (the Python node's backward).
//
// fast(): once a signature's route is settled (this node with its forward chosen, or PyTorch's
// convolution throughout), native.py registers it (settle); a later call of the same tensors'
// sizes, strides and types, the same arguments, and the same global state is then taken here from
// tvm_convgrad.torch.conv2d without the Python checks: cold (a step's large tensors evict the
// interpreter's data), those cost ~100 us a call more than nn.Conv2d's whole call.
//
// kept_empty(): outputs.py's kept mappings, served here once this module is loaded (for the node's
// grad_input and for outputs.empty): a tensor over an idle mapping of its length, or a new one,
// that returns to the idle ones when PyTorch frees its storage. Cold, the Python pool took ~60-75 us
// a tensor (its lease, numpy's array, from_numpy, set_), this ~20 as at::empty.

#include <ATen/PythonTorchFunctionTLS.h>
#include <ATen/autocast_mode.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/jit/frontend/tracer.h>
#include <torch/extension.h>
#include <tvm/ffi/c_api.h>

#include <sys/mman.h>
#include <unistd.h>

#include <array>
#include <initializer_list>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

#ifndef TVM_CONVGRAD_ALIGNMENT
#error "native.py defines TVM_CONVGRAD_ALIGNMENT (tvm_convgrad.torch.kernels.ALIGNMENT)"
#endif
constexpr int64_t kAlignment = TVM_CONVGRAD_ALIGNMENT;  // bytes the kernels' loads take a tensor's data to start on
using Pair = std::array<int64_t, 2>;                     // an (H, W) argument

// One signature's backward: its kernels (tvm-ffi Function handles; 0 until given) and layouts.
struct Plan {
  int64_t input_grad;       // (grad_output, weight) -> grad_input
  int64_t weight_grad;      // (input, grad_output) -> grad_weight
  int64_t weight_grad_f32;  // the same, its sums float32 unrounded (autocast's float32 weight)
  int64_t both;             // (input, grad_output, weight) -> (grad_input, grad_weight): a depthwise or 1x1 layer's in one pass
  bool channels_last;       // activations NHWC in memory (NXC), else NCHW (NCX)
  bool weights_last;        // weights OHWI in memory (OXI), else OIHW (OIX)
  bool kept_input_grad;     // grad_input over a kept mapping (kept_empty), else at::empty
};

std::mutex plans_lock;
std::vector<Plan> plans;  // registered from Python, never removed: a plan's id is its index
// (plan id, grad_output, input, weight, needs, narrow weight or None) -> (dX, dW, db); never destroyed (no GIL at exit)
py::object* fallback = nullptr;

// outputs.py's kept mappings (see the top): the idle ones (oldest first), those lent to a tensor now.
struct Kept {
  std::mutex lock;
  std::vector<std::pair<size_t, void*>> idle;
  std::unordered_map<void*, size_t> lent;
  size_t idle_bytes = 0;
  size_t max_idle_bytes = 0;  // outputs.KEPT_BYTES; 0: keep none (the "malloc" policy)
  int64_t maps = 0;
};
Kept* kept = new Kept();  // never destroyed (a tensor may outlive the module's statics at exit)

// A mapping back from its tensor: idle, the oldest idle ones unmapped to make room within
// max_idle_bytes (a returned mapping is the likeliest to be asked for again: the next step's); unmapped
// itself where it alone is more than that.
void give_back(void* data, size_t length) {
  std::vector<std::pair<size_t, void*>> dropped;
  {
    std::lock_guard<std::mutex> guard(kept->lock);
    kept->lent.erase(data);
    if (length > kept->max_idle_bytes) {
      dropped.emplace_back(length, data);
    } else {
      while (kept->idle_bytes + length > kept->max_idle_bytes) {
        dropped.push_back(kept->idle.front());
        kept->idle_bytes -= kept->idle.front().first;
        kept->idle.erase(kept->idle.begin());
      }
      kept->idle.emplace_back(length, data);
      kept->idle_bytes += length;
    }
  }
  for (auto& [bytes, address] : dropped) munmap(address, bytes);
}

// An uninitialized tensor over a kept mapping, laid out as at::empty lays it (channels-last where asked and 4-D).
at::Tensor kept_empty(std::vector<int64_t> sizes, at::ScalarType type, bool channels_last) {
  int64_t count = 1;
  for (int64_t size : sizes) count *= size;
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t length = std::max<size_t>(1, (count * at::elementSize(type) + page - 1) / page) * page;
  void* data = nullptr;
  {
    std::lock_guard<std::mutex> guard(kept->lock);
    for (auto it = kept->idle.rbegin(); it != kept->idle.rend(); ++it) {
      if (it->first == length) {
        data = it->second;
        kept->idle.erase(std::next(it).base());
        kept->idle_bytes -= length;
        break;
      }
    }
    if (data == nullptr) ++kept->maps;
  }
  if (data == nullptr) {
    data = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (data == MAP_FAILED) throw std::bad_alloc();
  }
  {
    std::lock_guard<std::mutex> guard(kept->lock);
    kept->lent[data] = length;
  }
  const bool last = channels_last && sizes.size() == 4;
  std::vector<int64_t> strides(sizes.size(), 1);
  if (last) {
    strides = c10::get_channels_last_strides_2d(sizes);
  } else {
    for (int64_t d = static_cast<int64_t>(sizes.size()) - 2; d >= 0; --d) {
      strides[d] = strides[d + 1] * std::max<int64_t>(1, sizes[d + 1]);
    }
  }
  return at::from_blob(data, sizes, strides, [length](void* p) { give_back(p, length); }, at::TensorOptions().dtype(type));
}

// Keep at most max_idle_bytes of idle mappings from now on (0: none); unmaps the idle ones beyond it.
size_t kept_limit(size_t max_idle_bytes) {
  std::vector<std::pair<size_t, void*>> dropped;
  {
    std::lock_guard<std::mutex> guard(kept->lock);
    kept->max_idle_bytes = max_idle_bytes;
    while (kept->idle_bytes > max_idle_bytes) {
      dropped.push_back(kept->idle.front());
      kept->idle_bytes -= kept->idle.front().first;
      kept->idle.erase(kept->idle.begin());
    }
  }
  size_t bytes = 0;
  for (const auto& [length, data] : dropped) {
    munmap(data, length);
    bytes += length;
  }
  return bytes;
}

// (mappings made, idle now, their bytes, lent now)
std::array<int64_t, 4> kept_counts() {
  std::lock_guard<std::mutex> guard(kept->lock);
  return {kept->maps, static_cast<int64_t>(kept->idle.size()), static_cast<int64_t>(kept->idle_bytes),
          static_cast<int64_t>(kept->lent.size())};
}

bool is_kept(int64_t address) {
  std::lock_guard<std::mutex> guard(kept->lock);
  return kept->lent.count(reinterpret_cast<void*>(address)) > 0;
}

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
  explicit View(const at::Tensor& vector) {  // (a bias: 1-D)
    shape[0] = vector.size(0);
    tensor = DLTensor{vector.data_ptr(), DLDevice{kDLCPU, 0}, 1, dl_type(vector), shape, nullptr, 0};
  }
};

// A kernel's call on the views' memory (its arguments in order: inputs, then results), under the
// profiler's range ``name``, or none where ``ranged`` is false (the forward: inside Conv2dFunction,
// as the Python path runs it).
void call(int64_t function, std::initializer_list<const View*> views, const char* name, bool ranged = true) {
  std::optional<at::RecordFunction> range;
  if (ranged && at::hasCallbacks()) {
    range.emplace(at::RecordScope::FUNCTION);
    if (range->isActive()) range->before(name, -1);
  }
  constexpr size_t kMostArguments = 5;  // (the one-pass kernels': x, dy, w, dx, dw)
  if (views.size() > kMostArguments) throw std::invalid_argument("tvm_convgrad native: a kernel call of more than 5 tensors");
  TVMFFIAny args[kMostArguments], result;
  int count = 0;
  for (const View* view : views) {
    args[count].type_index = kTVMFFIDLTensorPtr;
    args[count].zero_padding = 0;
    args[count++].v_ptr = const_cast<DLTensor*>(&view->tensor);
  }
  result.type_index = kTVMFFINone;
  result.zero_padding = 0;
  result.v_int64 = 0;
  if (TVMFFIFunctionCall(reinterpret_cast<TVMFFIObjectHandle>(function), args, count, &result) != 0) {
    TVMFFIObjectHandle error = nullptr;
    TVMFFIErrorMoveFromRaised(&error);
    if (error != nullptr) TVMFFIObjectDecRef(error);
    throw std::runtime_error(std::string("tvm_convgrad native: kernel ") + name + " failed");
  }
}

// A settled signature's forward arguments (pads symmetric) and, for the package's forward or
// PyTorch's BLAS way, the Python function (input, weight, bias) -> output (None: at::conv2d). The
// package's forward is called here instead where ``kernel`` is its handle: (x, w[, bias], y) in the
// plan's layouts, y of ``output_sizes`` over a kept mapping where ``kept_output``. (Cold, the Python
// function cost ~120 us a call above its kernel: its allocation, views and lookup.)
struct Forward {
  Pair stride, padding, dilation;
  int64_t groups;
  py::object function;
  int64_t kernel = 0;
  std::vector<int64_t> output_sizes;
  bool kept_output = false;
};

// The package's forward of a settled signature (Forward::kernel), on the tensors' memory as
// forward.ours lays it (each aligned, a copy where it is not), without the GIL.
at::Tensor package_forward(const Forward& f, const Plan& plan, const at::Tensor& input, const at::Tensor& weight,
                           const c10::optional<at::Tensor>& bias) {
  py::gil_scoped_release no_gil;
  const at::Tensor x = aligned(input, plan.channels_last), w = aligned(weight, plan.weights_last);
  const at::Tensor y = f.kept_output ? kept_empty(f.output_sizes, input.scalar_type(), plan.channels_last)
                                     : at::empty(f.output_sizes, input.options().memory_format(layout(plan.channels_last)));
  const View x_view(x, plan.channels_last), w_view(w, plan.weights_last), y_view(y, plan.channels_last);
  if (bias.has_value() && bias->defined()) {
    const at::Tensor b = aligned(*bias, false);
    const View b_view(b);
    call(f.kernel, {&x_view, &w_view, &b_view, &y_view}, "the package's forward", false);
  } else {
    call(f.kernel, {&x_view, &w_view, &y_view}, "the package's forward", false);
  }
  return y;
}

}  // namespace

namespace tvm_convgrad {  // (named: the profiler's range of the node's backward names it, CppNode<tvm_convgrad::Conv2dNative>)

struct Conv2dNative : public torch::autograd::Function<Conv2dNative> {
  // The forward, run here without recording a graph on the weight (``wide``: autocast's float32
  // weight, cast to the input's type here and its gradient the float32 sums): ``output(weight)``
  // (the caller's, Python, called with the GIL the caller holds), or where ``settled`` is given,
  // its function or at::conv2d (as F.conv2d calls it). The node records the gradients' edges and
  // saves what the backward reads.
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input, const at::Tensor& weight,
                            const c10::optional<at::Tensor>& bias, const py::object& output, int64_t plan,
                            const Forward* settled, bool wide) {
    RECORD_FUNCTION("Conv2dFunction", std::vector<c10::IValue>());  // (the Python node's range: what the step benchmark counts)
    const at::Tensor narrow = wide ? weight.to(input.scalar_type()) : weight;
    ctx->save_for_backward(wide ? variable_list{input, weight, narrow} : variable_list{input, weight});
    ctx->saved_data["plan"] = plan;
    ctx->saved_data["bias"] = bias.has_value() && bias->defined();
    if (settled == nullptr) return output(narrow).cast<at::Tensor>();
    if (settled->kernel != 0) return package_forward(*settled, plan_of(plan), input, narrow, bias);
    if (!settled->function.is_none()) return settled->function(input, narrow, bias).cast<at::Tensor>();
    py::gil_scoped_release no_gil;  // (as F.conv2d's binding releases it)
    return at::conv2d(input, narrow, bias, settled->stride, settled->padding, settled->dilation, settled->groups);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const at::Tensor& input = saved[0];
    const bool wide = saved.size() == 3;    // autocast's float32 weight (saved[1]) and its cast (saved[2])
    const at::Tensor& weight = saved.back();  // the weight the forward ran on
    const int64_t id = ctx->saved_data["plan"].toInt();
    const bool need_x = ctx->needs_input_grad(0), need_w = ctx->needs_input_grad(1);
    const bool need_b = ctx->saved_data["bias"].toBool() && ctx->needs_input_grad(2);  // (no edge without a bias)
    at::Tensor grad_input, grad_weight, grad_bias;
    const Plan plan = plan_of(id);
    const bool both = need_x && need_w && !wide && plan.both != 0;  // (a depthwise or 1x1 layer's two in one pass over dy)
    const int64_t weight_grad = wide ? plan.weight_grad_f32 : plan.weight_grad;
    const bool kernels = both || ((!need_x || plan.input_grad != 0) && (!need_w || weight_grad != 0));
    if (at::GradMode::is_enabled() || !plain(grads[0]) || !kernels) {  // create_graph=True, a batched or wrapped grad_output
      py::gil_scoped_acquire gil;
      const py::object narrow = wide ? py::cast(weight) : py::none();
      auto got = (*fallback)(id, grads[0], input, saved[1], py::make_tuple(need_x, need_w, need_b), narrow).cast<py::tuple>();
      grad_input = got[0].is_none() ? at::Tensor() : got[0].cast<at::Tensor>();
      grad_weight = got[1].is_none() ? at::Tensor() : got[1].cast<at::Tensor>();
      grad_bias = got[2].is_none() ? at::Tensor() : got[2].cast<at::Tensor>();
      return {grad_input, grad_weight, grad_bias, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
    }
    at::Tensor dy = grads[0].scalar_type() == input.scalar_type() ? grads[0] : grads[0].to(input.scalar_type());
    dy = aligned(dy, plan.channels_last);
    const View dy_view(dy, plan.channels_last);
    if (need_w) {
      const at::ScalarType type = wide ? at::kFloat : weight.scalar_type();
      grad_weight = at::empty(weight.sizes(), weight.options().dtype(type).memory_format(layout(plan.weights_last)));
    }
    if (need_x) {
      if (plan.kept_input_grad) {
        grad_input = kept_empty(input.sizes().vec(), input.scalar_type(), plan.channels_last);
      } else {
        grad_input = at::empty(input.sizes(), input.options().memory_format(layout(plan.channels_last)));
      }
    }
    // (the aligned tensors named: a View holds their memory's address only)
    const at::Tensor x = need_w ? aligned(input, plan.channels_last) : at::Tensor();
    const at::Tensor w = need_x ? aligned(weight, plan.weights_last) : at::Tensor();
    if (both) {
      const View x_view(x, plan.channels_last), w_view(w, plan.weights_last);
      const View dx_view(grad_input, plan.channels_last), dw_view(grad_weight, plan.weights_last);
      call(plan.both, {&x_view, &dy_view, &w_view, &dx_view, &dw_view}, "tvm_convgrad::conv2d_both_grads");
    } else {
      if (need_w) {  // dW first: dX, read next, is left in cache
        const View x_view(x, plan.channels_last), dw_view(grad_weight, plan.weights_last);
        call(weight_grad, {&x_view, &dy_view, &dw_view}, "tvm_convgrad::conv2d_weight_grad");
      }
      if (need_x) {
        const View w_view(w, plan.weights_last), dx_view(grad_input, plan.channels_last);
        call(plan.input_grad, {&dy_view, &w_view, &dx_view}, "tvm_convgrad::conv2d_input_grad");
      }
    }
    if (need_b) grad_bias = grads[0].sum({0, 2, 3});
    return {grad_input, grad_weight, grad_bias, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace tvm_convgrad

namespace {

using tvm_convgrad::Conv2dNative;

at::Tensor apply(const at::Tensor& input, const at::Tensor& weight, const c10::optional<at::Tensor>& bias,
                 const py::object& output, int64_t plan, bool wide) {
  return Conv2dNative::apply(input, weight, bias, output, plan, static_cast<const Forward*>(nullptr), wide);
}

// ---- the settled signatures' fast path (called from Python with the GIL; its table only with it)

// A call's signature: types (after autocast's casts), the tensors' sizes and strides, the
// arguments, which gradients, autocast.
using Key = std::array<int64_t, 29>;

struct KeyHash {
  size_t operator()(const Key& key) const {
    uint64_t h = 1469598103934665603ull;
    for (int64_t v : key) h = (h ^ static_cast<uint64_t>(v)) * 1099511628211ull;
    return static_cast<size_t>(h);
  }
};

struct Settled {
  int64_t plan;  // the node's plan id; -1: F.conv2d's own call (the modes give it PyTorch throughout)
  Forward forward;
};

std::unordered_map<Key, Settled, KeyHash>* settled_calls = nullptr;  // never destroyed (no GIL at exit)
py::object* forward_ad = nullptr;                                    // torch.autograd.forward_ad
py::object* transforms_active = nullptr;  // torch._C._are_functorch_transforms_active (its C++ header is not shipped whole)

// The types a call runs in (autocast's casts: casts.py, autocast_inputs): the input's and the
// bias's (-1: none), the weight's, and whether autocast was on.
struct Types {
  at::ScalarType input;
  int64_t bias;
  at::ScalarType weight;
  bool autocast;
};

Key key_of(const Types& types, const at::Tensor& input, const at::Tensor& weight, const Pair& stride, const Pair& padding,
           const Pair& dilation, int64_t groups, bool need_x, bool need_w) {
  Key key{};
  size_t i = 0;
  key[i++] = static_cast<int64_t>(types.input);
  key[i++] = types.bias;
  for (const at::Tensor* t : {&input, &weight}) {
    for (int d = 0; d < 4; ++d) key[i++] = t->size(d);
    for (int d = 0; d < 4; ++d) key[i++] = t->stride(d);
  }
  for (const auto* pair : {&stride, &padding, &dilation}) {
    key[i++] = (*pair)[0];
    key[i++] = (*pair)[1];
  }
  key[i++] = groups;
  key[i++] = need_x;
  key[i++] = need_w;
  key[i++] = static_cast<int64_t>(types.weight);
  key[i++] = types.autocast;
  return key;
}

// An int, or a tuple / list of two (not a bool: Python's path rejects or reads those itself).
bool int_pair(PyObject* value, Pair& pair) {
  if (PyLong_CheckExact(value)) {
    pair[0] = pair[1] = PyLong_AsLongLong(value);
    return !PyErr_Occurred();
  }
  if ((!PyTuple_CheckExact(value) && !PyList_CheckExact(value)) || PySequence_Fast_GET_SIZE(value) != 2) return false;
  for (int i = 0; i < 2; ++i) {
    PyObject* item = PySequence_Fast_GET_ITEM(value, i);
    if (!PyLong_CheckExact(item)) return false;
    pair[i] = PyLong_AsLongLong(item);
  }
  return !PyErr_Occurred();
}

// A plain 4-D tensor (torch.Tensor or nn.Parameter itself, no subclass) the kernels may read.
const at::Tensor* plain_tensor(PyObject* value, int64_t dim) {
  if (!THPVariable_CheckExact(value)) return nullptr;
  const at::Tensor& t = THPVariable_Unpack(value);
  return t.dim() == dim && t.numel() > 0 && plain(t) ? &t : nullptr;
}

// The state a settled route assumed: grad mode on, no tracing, transform, torch function mode,
// forward-mode AD level or deterministic algorithms (autocast is part of the key; a dispatch mode,
// plain_tensor's plain() rules out).
bool plain_state() {
  return at::GradMode::is_enabled() && !torch::jit::tracer::isTracing() &&
         !at::impl::torch_function_mode_enabled() && !(*transforms_active)().cast<bool>() &&
         !at::globalContext().deterministicAlgorithms() && forward_ad->attr("_current_level").cast<int64_t>() < 0;
}

// The convolution of a settled signature's call through the node, or None (Python's path then).
py::object fast(py::handle input_obj, py::handle weight_obj, py::handle bias_obj, py::handle stride_obj, py::handle padding_obj,
                py::handle dilation_obj, py::handle groups_obj) {
  if (settled_calls == nullptr || settled_calls->empty()) return py::none();
  const at::Tensor* input = plain_tensor(input_obj.ptr(), 4);
  const at::Tensor* weight = plain_tensor(weight_obj.ptr(), 4);
  const at::Tensor* bias = bias_obj.is_none() ? nullptr : plain_tensor(bias_obj.ptr(), 1);
  if (input == nullptr || weight == nullptr || (bias == nullptr && !bias_obj.is_none())) return py::none();
  Pair stride, padding, dilation, groups;
  if (!int_pair(stride_obj.ptr(), stride) || !int_pair(padding_obj.ptr(), padding) || !int_pair(dilation_obj.ptr(), dilation) ||
      !PyLong_CheckExact(groups_obj.ptr()) || !int_pair(groups_obj.ptr(), groups) || !plain_state()) {
    PyErr_Clear();
    return py::none();
  }
  // autocast's casts (casts.py, autocast_inputs): floating tensors but float64 to its type; a float32
  // weight beside a bf16 / f16 input kept (wide), any other weight the Python path's to cast
  const bool autocast = at::autocast::is_autocast_enabled(at::kCPU);
  const at::ScalarType low = autocast ? at::autocast::get_autocast_dtype(at::kCPU) : at::kFloat;
  auto cast = [&](const at::Tensor& t) {
    return autocast && at::isFloatingType(t.scalar_type()) && t.scalar_type() != at::kDouble ? low : t.scalar_type();
  };
  const at::ScalarType x_type = cast(*input);
  const bool wide = autocast && weight->scalar_type() == at::kFloat && (x_type == at::kBFloat16 || x_type == at::kHalf);
  if (autocast && !wide && cast(*weight) != weight->scalar_type()) return py::none();
  const Types types{x_type, bias == nullptr ? -1 : static_cast<int64_t>(cast(*bias)), weight->scalar_type(), autocast};
  const bool need_x = input->requires_grad(), need_w = weight->requires_grad();
  const auto found = settled_calls->find(key_of(types, *input, *weight, stride, padding, dilation, groups[0], need_x, need_w));
  if (found == settled_calls->end()) return py::none();
  const Settled entry = found->second;  // (a copy: a thread the call lets run may empty the table)
  const at::Tensor x = x_type == input->scalar_type() ? *input : input->to(x_type);  // (recorded, as autocast's cast)
  c10::optional<at::Tensor> bias_arg;
  if (bias != nullptr) {
    const auto bias_type = static_cast<at::ScalarType>(types.bias);
    bias_arg = bias_type == bias->scalar_type() ? *bias : bias->to(bias_type);
  }
  // (Python's: torch.autocast("cpu", enabled=False))
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::DispatchKey::AutocastCPU);
  if (entry.plan < 0) {
    const Forward& f = entry.forward;
    at::Tensor output;
    {
      py::gil_scoped_release no_gil;
      output = at::conv2d(x, *weight, bias_arg, f.stride, f.padding, f.dilation, f.groups);
    }
    return py::cast(output);
  }
  const at::Tensor output = Conv2dNative::apply(x, *weight, bias_arg, py::none(), entry.plan, &entry.forward, wide);
  return py::cast(output);
}

// Register a call's signature as settled: its later calls take fast() (``function``: see Forward;
// the tensors as the node got them, autocast's casts made: ``autocast`` whether it was on).
void settle(const at::Tensor& input, const at::Tensor& weight, const c10::optional<at::Tensor>& bias, Pair stride, Pair padding,
            Pair dilation, int64_t groups, bool need_x, bool need_w, int64_t plan, py::object function, bool autocast,
            int64_t kernel, std::vector<int64_t> output_sizes, bool kept_output) {
  if (settled_calls == nullptr) {
    settled_calls = new std::unordered_map<Key, Settled, KeyHash>();
    forward_ad = new py::object(py::module_::import("torch.autograd.forward_ad"));
    transforms_active = new py::object(py::module_::import("torch._C").attr("_are_functorch_transforms_active"));
  }
  const bool has_bias = bias.has_value() && bias->defined();
  const int64_t bias_type = has_bias ? static_cast<int64_t>(bias->scalar_type()) : -1;
  const Types types{input.scalar_type(), bias_type, weight.scalar_type(), autocast};
  (*settled_calls)[key_of(types, input, weight, stride, padding, dilation, groups, need_x, need_w)] =
      Settled{plan, Forward{stride, padding, dilation, groups, std::move(function), kernel, std::move(output_sizes),
                            kept_output}};
}

void unsettle() {
  if (settled_calls != nullptr) settled_calls->clear();
}

size_t settled_count() { return settled_calls == nullptr ? 0 : settled_calls->size(); }

int64_t add_plan(bool channels_last, bool weights_last) {
  std::lock_guard<std::mutex> guard(plans_lock);
  plans.push_back(Plan{0, 0, 0, 0, channels_last, weights_last, false});
  return static_cast<int64_t>(plans.size()) - 1;
}

// kernel: 0 dX, 1 dW, 2 dW with float32 sums
void set_kernel(int64_t id, int64_t kernel, int64_t function) {
  std::lock_guard<std::mutex> guard(plans_lock);
  Plan& plan = plans.at(static_cast<size_t>(id));
  (kernel == 0 ? plan.input_grad : kernel == 1 ? plan.weight_grad : kernel == 2 ? plan.weight_grad_f32 : plan.both) = function;
}

void set_kept(int64_t id, bool kept) {
  std::lock_guard<std::mutex> guard(plans_lock);
  plans.at(static_cast<size_t>(id)).kept_input_grad = kept;
}

void set_fallback(py::object function) {
  if (fallback == nullptr) fallback = new py::object();
  *fallback = std::move(function);
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("apply", &apply, "the convolution's node: (input, weight, bias, forward, plan id, wide) -> forward(weight or its cast)");
  m.def("add_plan", &add_plan, "register a signature's layouts: (channels_last, weights_last) -> id");
  m.def("set_kernel", &set_kernel,
        "a registered signature's kernel: (id, 0 dX | 1 dW | 2 dW in float32 | 3 dX and dW in one, handle)");
  m.def("set_kept", &set_kept, "whether a registered signature's grad_input is a kept mapping: (id, kept)");
  m.def("set_fallback", &set_fallback, "the Python backward of a node that records a graph");
  m.def("kept_empty", &kept_empty, "an uninitialized tensor over a kept mapping: (sizes, dtype, channels_last)");
  m.def("kept_limit", &kept_limit, "the most bytes of idle mappings kept (0: none); returns the bytes unmapped now");
  m.def("kept_counts", &kept_counts, "(mappings made, idle now, their bytes, lent now)");
  m.def("is_kept", &is_kept, "whether a data address is a kept mapping lent now");
  m.def("fast", &fast, "a settled signature's call, else None: (input, weight, bias, stride, padding, dilation, groups)");
  m.def("settle", &settle,
        "register a signature as settled (tensors, arguments, needs, plan id, forward or None, autocast, the package's "
        "forward kernel or 0, its output's sizes, whether kept)");
  m.def("unsettle", &unsettle, "forget every settled signature (a mode changed)");
  m.def("settled_count", &settled_count, "how many signatures are settled");
}
