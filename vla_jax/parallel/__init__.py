"""Long sequences over several devices: the recurrences with their time axis sharded
(context parallelism). Math and usage in README.md."""

from vla_jax.parallel.segments import segment_op
from vla_jax.parallel.shard import SEQ_AXIS, sequence_op, shard_sequence

__all__ = ["SEQ_AXIS", "segment_op", "sequence_op", "shard_sequence"]
