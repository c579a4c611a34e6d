"""On-demand capture of a running process: no daemon, no code change, a private channel.

A process becomes capturable with ``POLYPROF_ON_DEMAND=1`` in its environment (polyprof's ``.pth``
file starts listening as the interpreter starts, so ``python train.py`` and ``torchrun train.py`` need
no import of polyprof), with ``polyprof run --on-demand script.py``, or with ``polyprof.listen()``.
Nothing is recorded until a capture is asked for::

    $ polyprof ps                                   # this user's capturable processes
    $ polyprof capture 4242 --steps 3 -o cap.json.gz
    $ polyprof capture 4242 --job --steps 3 -o job.json.gz    # every rank of its torch.distributed job

Rooms: :mod:`.channel` (socket folder, peer check, framing), :mod:`.protocol` (the requests),
:mod:`.listener` (the target's thread), :mod:`.capture` (one capture), :mod:`polyprof.torch.steps` (step
boundaries), :mod:`.job` (whole jobs through the store), :mod:`.client` (the CLI's side);
:mod:`polyprof.startup` is what the ``.pth`` file's hook arms.
"""

from __future__ import annotations

ENV_VAR = "POLYPROF_ON_DEMAND"


def listen() -> str:
    """Make this process capturable; see :func:`polyprof.ondemand.listener.listen`."""
    from polyprof.ondemand.listener import listen as _listen

    return _listen()
