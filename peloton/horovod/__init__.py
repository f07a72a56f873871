"""Horovod's package names for peloton's collective runtime: change one import line.

``import horovod.torch as hvd`` becomes ``import peloton.horovod.torch as hvd``; the rest of a
Horovod script is unchanged where peloton has the call (README "Coming from Horovod" lists
what differs and what is not there yet). ``horovodrun -np 4 python train.py`` becomes
``peloton-run -np 4 python train.py`` (:mod:`peloton.collective.run`), which starts the ranks
with the environment a peloton gang gets; there is no ``horovod.run(func)`` to call from Python.
"""
