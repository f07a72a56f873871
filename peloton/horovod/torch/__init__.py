"""``horovod.torch`` under its names: ``import peloton.horovod.torch as hvd``.

Everything here is :mod:`peloton.collective.torch`, whose calls take Horovod's arguments; see
README "Coming from Horovod" for the differences.
"""

from peloton.collective.torch import *  # noqa: F403  (the whole layer, by its __all__)
from peloton.collective.torch import __all__ as __all__
from peloton.horovod.torch import elastic as elastic  # hvd.elastic.run, hvd.elastic.TorchState, ...
