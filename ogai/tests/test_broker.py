"""The embedded broker never shows a consumer a message before it is completely written."""

import os

from kombu import Connection
from kombu.transport import filesystem

from ogai import broker


def test_a_message_appears_only_once_it_is_complete(tmp_path, monkeypatch):
    folder = tmp_path / "queue"
    folder.mkdir()
    seen_while_writing = []
    real_dumps = broker.dumps

    def dumps(payload):
        # What a consumer listing the folder would find while the message is being written.
        seen_while_writing.extend(name for name in os.listdir(folder) if name.endswith(".msg"))
        return real_dumps(payload)

    monkeypatch.setattr(broker, "dumps", dumps)
    monkeypatch.setattr(filesystem, "dumps", dumps)  # kombu's own channel, for comparison
    options = {"data_folder_in": str(folder), "data_folder_out": str(folder),
               "processed_folder": str(tmp_path / "done"), "store_processed": False,
               "control_folder": str(tmp_path / "control")}
    with Connection("filesystem://", transport=broker.Transport,
                    transport_options=options) as connection:
        queue = connection.SimpleQueue("work")
        queue.put({"n": 1})
        assert seen_while_writing == []
        assert queue.get(timeout=1).payload == {"n": 1}
        assert [name for name in os.listdir(folder) if name.endswith(".part")] == []
        queue.close()
