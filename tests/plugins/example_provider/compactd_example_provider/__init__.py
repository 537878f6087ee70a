"""A complete compactd provider: long tool results become a short, reversible stub."""

from dataclasses import dataclass

from proxy.providers.base import (
    CompactionResult,
    CompressionConfig,
    ContextProvider,
    Message,
    compute_source_digest,
    make_ref_id,
    option,
    parse_options,
    ref_marker,
)


@dataclass(frozen=True)
class Options:  # the host checks each policy's options against this at start-up
    keep_chars: int = option(200, minimum=1, doc="characters of a long tool result kept")


class ShortToolResults(ContextProvider):
    name = "short-tools"
    option_schema = Options

    def compress(self, messages: list[Message], config: CompressionConfig) -> CompactionResult:
        keep = parse_options(Options, config.extra_config).keep_chars
        out, verbatim, last = [], {}, -1
        for i, m in enumerate(messages[:-1]):  # the final message is never touched
            text = m.get("content")
            if m.get("role") == "tool" and isinstance(text, str) and len(text) > 4 * keep:
                ref = make_ref_id([m])  # the original goes to `verbatim` under this id ...
                marker = ref_marker(ref, 1, config.count_message(m), "shortened")
                out.append({**m, "content": f"{marker}\n{text[:keep]}…"})  # ... shown here
                verbatim[ref], last = [m], i
            else:
                out.append(m)
        out.extend(messages[-1:])
        return CompactionResult(out, compute_source_digest(messages), last, verbatim)
