"""TensorBoard summaries: ``SummaryWriter`` (call-compatible with
``torch.utils.tensorboard.SummaryWriter``), ``log_model`` and the rank source.
The Summary* ops themselves are registry kernels (``ortcpu_torch.kernels.SummaryScalar``,
...) returning serialized ``Summary`` bytes; ``SummaryWriter.add_summary`` writes them."""

from ._rank import get_rank, set_rank_source
from .writer import SummaryWriter, log_model

__all__ = ["SummaryWriter", "log_model", "get_rank", "set_rank_source"]
