"""Keep secrets out of log output: mask URLs' passwords and known secret values.

Why a logging filter as well as masked ``repr``s: a secret can reach a log line through text we
do not control (a client library's error message that quotes a URL, an f-string written in a
hurry). ``install_secret_filter(config)`` attaches ``SecretFilter`` to the root handlers (and to
``logging.lastResort``, which prints when no handler is configured), so every record is
rewritten before any handler formats it: each configured secret value becomes ``******`` and
any ``scheme://user:password@`` becomes ``scheme://user:******@``. The URL rule needs no
configured value, so the filter is installed whatever the configuration holds. A handler added
after the filter was installed does not get it: configure logging first (``lbctl`` does).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable

from loadbalance.config import SECRET_MASK, LoadBalancerConfig, redact_url

__all__ = ["SecretFilter", "install_secret_filter", "redact_text", "redact_url"]

_URL_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://[^\s'\"]*@[^\s'\"/]+")


def redact_text(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` with every URL password and every value in ``secrets`` masked."""
    text = _URL_IN_TEXT.sub(lambda m: redact_url(m.group(0)), text)
    for s in sorted({s for s in secrets if s}, key=len, reverse=True):  # longest first
        text = text.replace(s, SECRET_MASK)
    return text


class SecretFilter(logging.Filter):
    """Rewrites each record's message (with its arguments merged) and exception text."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        super().__init__()
        self.secrets = [s for s in secrets if s]

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a bad format string: leave the record to logging's own error path
            return True
        record.msg = redact_text(message, self.secrets)
        record.args = None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact_text(record.exc_text, self.secrets)
        if record.stack_info:
            record.stack_info = redact_text(record.stack_info, self.secrets)
        return True


def install_secret_filter(
    config: LoadBalancerConfig | None = None, logger: logging.Logger | None = None
) -> SecretFilter:
    """Attach a ``SecretFilter`` for ``config``'s secrets to ``logger``'s handlers (root by
    default) and to the logger itself; returns it so a caller can remove it again."""
    target = logger or logging.getLogger()
    flt = SecretFilter(config.secret_values() if config is not None else ())
    target.addFilter(flt)
    handlers = list(target.handlers)
    if target is logging.getLogger() and logging.lastResort is not None:
        handlers.append(logging.lastResort)
    for handler in handlers:
        if flt not in handler.filters:
            handler.addFilter(flt)
    return flt
