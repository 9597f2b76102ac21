"""Celery's filesystem transport, with messages written atomically.

kombu's own `_put` creates the message file and then writes it, while a consumer lists the
folder, moves the file away and reads it: under load a consumer can read a message before it
is written, fail to parse it and stop the whole worker. Here a message is written under a name
no consumer looks at (it does not end in `.msg`) and renamed into place once complete, which
is atomic on one file system.
"""

import os
import uuid
from time import monotonic

from kombu.transport import filesystem
from kombu.utils.encoding import str_to_bytes
from kombu.utils.json import dumps


class Channel(filesystem.Channel):
    def _put(self, queue, payload, **kwargs):
        name = f"{round(monotonic() * 1000)}_{uuid.uuid4()}.{queue}.msg"
        final = os.path.join(self.data_folder_out, name)
        partial = f"{final}.part"
        try:
            with open(partial, "wb") as out:
                out.write(str_to_bytes(dumps(payload)))
            os.replace(partial, final)
        except OSError as exc:
            raise filesystem.ChannelError(f"Cannot add file {final!r} to directory") from exc


class Transport(filesystem.Transport):
    Channel = Channel
