"""``horovod.torch.elastic`` under its names: ``hvd.elastic.run``, ``hvd.elastic.TorchState``,
``hvd.elastic.ElasticSampler``, ... after ``import peloton.horovod.torch as hvd``.

Everything here is peloton's elastic runtime (:mod:`peloton.collective.elastic`): membership
comes from the gang's rendezvous endpoint that ``peloton-run --elastic --min M --max N`` serves
(in place of ``horovodrun --min-np/--max-np --host-discovery-script``). README "Coming from
Horovod" lists what differs.
"""

from peloton.collective.elastic import HostsUpdatedInterrupt, State, run
from peloton.collective.sampler import ElasticSampler
from peloton.collective.torch import TorchState

#: Horovod's name for the state of plain Python values (``ObjectState(epoch=0, batch=0)``).
ObjectState = State

__all__ = ["ElasticSampler", "HostsUpdatedInterrupt", "ObjectState", "State", "TorchState", "run"]
