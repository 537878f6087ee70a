"""Two more kinds of dev corpus for bench/corpora.py: a windowed-viewer agent, IRC help chats.

- `swe_agent_windowed_trajs`: SWE-agent's own trajectories (GitHub `princeton-nlp/SWE-agent`,
  MIT): the runs its repository ships as demonstrations and test data (SWE-bench dev issues,
  HumanEvalFix, CTF challenges, a test repository), each an agent working through a windowed file
  viewer (`open`, `goto`, `scroll_down`, `edit` with `[File: … (N lines total)]` windows). Each
  step becomes a `swe_agent` tool call and its observation the `tool` result; the run ends
  before `submit`. None is SWE-agent's GPT-4 run on SWE-bench Lite (reserved for evaluation).
  bench/quality cuts each run at 40 %, 60 % and 80 % (three cases a run: the corpus is small)
  and probes what the turns after the cut use.
- `ubuntu_irc_support_chats`: help threads of the `#ubuntu` IRC channel and of the other
  channels the IRC disentanglement data annotates (GitHub `jkkummerfeld/irc-disentanglement`,
  data CC-BY-4.0): a thread is a connected component of the annotated reply links; its first
  speaker is the user, everyone who answers is the assistant (each line keeps its `<nick>`).
  Only long threads with at least one URL are kept; pastebins, wiki pages, bug reports and
  package versions are what they name. bench/quality probes their rare specific items.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.corpora import git_files, git_show, patch_answers, split_of

SWE_AGENT_REPO = "princeton-nlp+SWE-agent"
SWE_AGENT_COMMIT = "0772c99cb2903ccf22ba543eaf128742afa470d6"
SWE_AGENT_DIRS = ("trajectories", "tests/test_data/trajectories")
IRC_REPO = "jkkummerfeld+irc-disentanglement"
IRC_COMMIT = "82ed04f9627a45d0d6f2ec3c8683c88eb408a0d5"
IRC_DIRS = ("data/train", "data/dev", "data/test", "data/new-domains")
IRC_MIN_LINES = 30
SWE_AGENT_TOOL = {
    "type": "function",
    "function": {
        "name": "swe_agent",
        "description": "Run one SWE-agent command (open, goto, scroll_down, edit, search_file, "
        "a shell command, …) and return its output.",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string"}},
            "required": ["command"],
        },
    },
}
_IRC_LINE = re.compile(r"^\[[\d:]+\] <([^>]+)> (.*)$")
_URL = re.compile(r"https?://|www\.")


def windowed_messages(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A SWE-agent history as native tool calls: each assistant step with an `action` becomes a
    `swe_agent` call, the message after it (the observation) its `tool` result. The run ends
    before `submit`, on the last observation, as a mid-run request does."""
    out: list[dict[str, Any]] = []
    i = 0
    while i < len(history):
        m = history[i]
        role = "user" if m["role"] not in ("system", "assistant") else m["role"]
        action = str(m.get("action") or "").strip() if role == "assistant" else ""
        answered = i + 1 < len(history) and history[i + 1]["role"] in ("user", "tool")
        if not action or not answered:
            out.append({"role": role, "content": str(m.get("content") or "")})
            i += 1
            continue
        if action == "submit":
            break
        call_id = f"call_{len(out):04d}"
        thought = str(m.get("thought") or "").strip()
        call = {"name": "swe_agent", "arguments": json.dumps({"command": action})}
        out.append(
            {
                "role": "assistant",
                "content": thought or None,
                "tool_calls": [{"id": call_id, "type": "function", "function": call}],
            }
        )
        out.append(
            {"role": "tool", "tool_call_id": call_id, "content": str(history[i + 1]["content"])}
        )
        i += 2
    while out and out[-1]["role"] == "assistant":
        out.pop()  # a final thought without a step: the run ends on an observation
    return out


def swe_windowed_cases(mirrors: Path) -> Iterator[dict[str, Any]]:
    """The distinct runs of SWE-agent's repository (copies and replays of one run kept once)."""
    repo = mirrors / SWE_AGENT_REPO / "repo"
    seen: set[str] = set()
    for under in SWE_AGENT_DIRS:
        for path in git_files(repo, SWE_AGENT_COMMIT, under):
            if not path.endswith(".traj"):
                continue
            traj = json.loads(git_show(repo, SWE_AGENT_COMMIT, path))
            actions = json.dumps([m.get("action") for m in traj.get("history", ())])
            messages = windowed_messages(traj.get("history", []))
            if actions in seen or len(messages) < 6 or messages[-1]["role"] != "tool":
                continue
            seen.add(actions)
            case_id = "/".join(path.split("/")[-2:]).removesuffix(".traj")
            submission = str((traj.get("info") or {}).get("submission") or "")
            yield {
                "id": case_id,
                "split": split_of(case_id),
                "messages": messages,
                "tools": [SWE_AGENT_TOOL],
                "answers": patch_answers(submission) if "diff --git" in submission else [],
            }


def irc_threads(raw: str, links: str) -> list[list[tuple[str, str]]]:
    """The threads of an annotated IRC log: (nick, text) lines joined by the reply links."""
    parent: dict[int, int] = {}

    def root(x: int) -> int:
        while parent.setdefault(x, x) != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for line in links.splitlines():
        a, b = (int(v) for v in line.split()[:2])
        ra, rb = root(a), root(b)
        parent[max(ra, rb)] = min(ra, rb)
    lines = raw.splitlines()
    threads: dict[int, list[tuple[str, str]]] = defaultdict(list)
    for i in sorted(parent):
        m = _IRC_LINE.match(lines[i]) if i < len(lines) else None
        if m:
            threads[root(i)].append((m.group(1), m.group(2)))
    return list(threads.values())


def irc_messages(thread: list[tuple[str, str]], channel: str) -> list[dict[str, Any]]:
    """A thread as a chat: its first speaker is the user, everyone answering the assistant;
    a speaker's consecutive lines form one message; it ends on the user's last line."""
    user = thread[0][0]
    out: list[dict[str, Any]] = [
        {"role": "system", "content": f"IRC help channel {channel}; the user is {user}."}
    ]
    for nick, text in thread:
        role = "user" if nick == user else "assistant"
        line = text if role == "user" else f"<{nick}> {text}"
        if out[-1]["role"] == role:
            out[-1]["content"] += "\n" + line
        else:
            out.append({"role": role, "content": line})
    while out[-1]["role"] != "user":
        out.pop()
    return out


def irc_cases(mirrors: Path, min_lines: int = IRC_MIN_LINES) -> Iterator[dict[str, Any]]:
    """The long threads with a URL of every annotated log."""
    repo = mirrors / IRC_REPO / "repo"
    for under in IRC_DIRS:
        for path in git_files(repo, IRC_COMMIT, under):
            if not path.endswith(".raw.txt"):
                continue
            raw = git_show(repo, IRC_COMMIT, path).decode(errors="replace")
            links = path.removesuffix(".raw.txt") + ".annotation.txt"
            annotation = git_show(repo, IRC_COMMIT, links).decode()
            channel = path.split("/")[-2] if "new-domains" in path else "#ubuntu"
            for thread in irc_threads(raw, annotation):
                text = "\n".join(t for _, t in thread)
                if len(thread) < min_lines or not _URL.search(text):
                    continue
                messages = irc_messages(thread, channel)
                if len(messages) < 6:
                    continue
                case_id = f"{path.split('/')[-1].removesuffix('.raw.txt')}:{thread[0][0]}"
                case_id += f":{len(thread)}"
                yield {
                    "id": case_id,
                    "split": split_of(case_id),
                    "messages": messages,
                    "answers": [],
                }


READMES = {
    "swe_agent_windowed_trajs": f"""# Agent runs with a windowed file viewer

* Source: GitHub `princeton-nlp/SWE-agent` (now SWE-agent/SWE-agent), snapshot commit
  {SWE_AGENT_COMMIT}, every `*.traj` under `trajectories/` and
  `tests/test_data/trajectories/`: SWE-agent's demonstrations and test runs (SWE-bench dev
  issues, HumanEvalFix, CTF challenges, a test repository), copies and replays of the same
  run kept once. Licence: MIT (LICENSE, John Yang, Carlos E. Jimenez et al., 2024).
  Not SWE-agent's GPT-4 run on SWE-bench Lite.
* Converted by `bench/corpora.py`: each step's `action` became a `swe_agent` tool call, the
  observation after it (`[File: … (N lines total)]` windows, search results, shell output) its
  `tool` result; the run ends before `submit`. `tools`: the one `swe_agent` schema.
* `answers`: the files, hunk functions and removed lines of the submitted patch (empty for
  the runs that submit a flag). bench/quality cuts each run at 40 %, 60 % and 80 % and probes
  what the turns after the cut use.
""",
    "ubuntu_irc_support_chats": f"""# IRC help threads (links, versions, commands)

* Source: GitHub `jkkummerfeld/irc-disentanglement`, snapshot commit {IRC_COMMIT},
  `data/{{train,dev,test,new-domains}}/*.raw.txt` with their `*.annotation.txt` reply links
  (the `#ubuntu` channel of the Ubuntu IRC logs, and the channels of the ALTA 2023 paper).
  Licence of the data: CC-BY-4.0 (data/LICENSE-data.txt; Kummerfeld et al., ACL 2019).
* Converted by `bench/corpora.py`: a thread is a connected component of the reply links;
  threads of at least {IRC_MIN_LINES} lines that contain a URL are kept. The first speaker
  is the user, everyone answering the assistant (each line keeps its `<nick>`); a speaker's
  consecutive lines are one message; cut to end on the user's last line.
* `answers` is empty: bench/quality probes the rare specific items of the history (URLs,
  versions, paths, names said in at most 3 messages).
""",
}
