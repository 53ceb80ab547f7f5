"""One JSON object a line, with the job id, batch id and stage when the call site gives them
(`log.info(..., extra={"job_id": ..., "batch_id": ..., "stage": ...})`)."""

from __future__ import annotations

import json
import logging
import os
import socket

_FIELDS = ("job_id", "batch_id", "stage", "worker")


class JsonFormatter(logging.Formatter):
    host = socket.gethostname()

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
            "process": os.getpid(),
            "host": self.host,
        }
        for field in _FIELDS:
            value = getattr(record, field, None)
            if value is not None:
                entry[field] = str(value)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)
