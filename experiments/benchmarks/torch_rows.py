"""flash-linear-attention's DeltaNet kernel (`fla.ops.delta_rule.chunk_delta_rule`, PyTorch +
Triton) at the suite's shapes: bf16, keys l2-normalised once when the inputs are made (outside
the timed call), beta = 1, scale = 1 (o_t = S_t q_t, as the library's `deltanet`)."""


def available():
  """None when fla and a CUDA device are usable, else the reason they are not."""
  try:
    import torch  # pylint: disable=import-outside-toplevel
  except ImportError as err:
    return f"no torch ({err})"
  if not torch.cuda.is_available():
    return "no GPU"
  try:
    from fla.ops.delta_rule import chunk_delta_rule  # pylint: disable=import-outside-toplevel,unused-import
  except Exception as err:  # pylint: disable=broad-except
    return f"fla import failed: {type(err).__name__}: {err}"
  return None


def torch_dtype(name):
  import torch  # pylint: disable=import-outside-toplevel
  return {"bfloat16": torch.bfloat16, "float32": torch.float32,
          "float16": torch.float16}[name]


def input_sets(B, T, H, d, dtype, n_sets, backward):
  import torch  # pylint: disable=import-outside-toplevel
  import torch.nn.functional as F  # pylint: disable=import-outside-toplevel
  dt = torch_dtype(dtype)
  sets = []
  for s in range(n_sets):
    g = torch.Generator(device="cuda").manual_seed(100 * s + 1)
    rnd = lambda: torch.randn(B, T, H, d, device="cuda", dtype=torch.float32, generator=g)
    q, v = rnd().to(dt), rnd().to(dt)
    k = F.normalize(rnd(), p=2, dim=-1).to(dt)
    beta = torch.ones(B, T, H, device="cuda", dtype=dt)
    xs = [q, k, v, beta]
    if backward:
      for x in xs:
        x.requires_grad_(True)
      xs.append(rnd().to(dt))
    sets.append(tuple(xs))
  return sets


def make_call(pass_):
  """inputs -> zero-argument callable running one forward (or forward + backward)."""
  import torch  # pylint: disable=import-outside-toplevel
  from fla.ops.delta_rule import chunk_delta_rule  # pylint: disable=import-outside-toplevel

  def make(inputs):
    if pass_ == "fwd":
      q, k, v, beta = inputs

      def call():
        with torch.no_grad():
          return chunk_delta_rule(q, k, v, beta, scale=1.0)[0]
      return call
    q, k, v, beta, cot = inputs

    def call_bwd():
      o = chunk_delta_rule(q, k, v, beta, scale=1.0)[0]
      return torch.autograd.grad((o.float() * cot.float()).sum(), (q, k, v, beta))
    return call_bwd
  return make
