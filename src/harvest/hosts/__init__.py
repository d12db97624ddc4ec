"""Where commands run and what the host's network looks like: local checks now, SSH later.

Every call here has a timeout; nothing here signals a process.
"""

from __future__ import annotations

from harvest.hosts.net import listening_pids, port_bindable, port_listening

__all__ = ["listening_pids", "port_bindable", "port_listening"]
