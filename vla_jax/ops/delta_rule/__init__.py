"""The generalised delta rule, the state path shared by VLA, DeltaNet and Gated DeltaNet.

Per head, with query q_t, erase key e_t, write key w_t (all [dk]), value v_t ([dv]) and
log decay g_t <= 0 (gamma_t = exp(g_t)):

    S_t = gamma_t S_{t-1} + (v_t - gamma_t S_{t-1} e_t) w_t^T
        = gamma_t S_{t-1} (I - e_t w_t^T) + v_t w_t^T,      o_t = S_t q_t.

- VLA: e = khat (unit key), w = a (unit write direction from the penalty path), gamma = 1.
- DeltaNet: e = khat, w = beta khat, gamma = 1.
- Gated DeltaNet: e = khat, w = beta khat, per-token gamma.
- Linear attention: no erase (e = None), w = phi(k).

All three forms take arrays [B, T, H, D] in the compute dtype and a state S0 [B, H, dv, dk]
and return (o [B, T, H, dv], S_T [B, H, dv, dk]). See README.md for the chunkwise algebra.
"""

from vla_jax.ops.delta_rule.associative_scan import delta_rule_associative_scan
from vla_jax.ops.delta_rule.chunk import delta_rule_chunked
from vla_jax.ops.delta_rule.naive import delta_rule_scan

__all__ = ["delta_rule_scan", "delta_rule_associative_scan", "delta_rule_chunked"]
