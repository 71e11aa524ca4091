"""Which TCP addresses a process tree listens on, and this machine's addresses that are not loopback (Linux /proc)."""

from __future__ import annotations

import ipaddress
import os
import re
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

LISTEN = "0A"  # a TCP socket's state in /proc/net/tcp: listening


def process_tree(root: int) -> set[int]:
    """``root`` and every process descended from it (a new session or process group included)."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue  # gone meanwhile
        parents[int(stat.parent.name)] = int(text.rsplit(")", 1)[1].split()[1])  # the name may hold spaces
    tree, grew = {root}, True
    while grew:
        found = {pid for pid, parent in parents.items() if parent in tree} - tree
        tree |= found
        grew = bool(found)
    return tree


def running(pids: set[int], program: str) -> set[int]:
    """The processes among ``pids`` whose command line names ``program``."""
    found = set()
    for pid in pids:
        try:
            arguments = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(program in os.path.basename(a.decode(errors="replace")) for a in arguments):
            found.add(pid)
    return found


def listening(pids: set[int]) -> list[tuple[str, int]]:
    """(address, port) of every listening TCP socket the processes hold."""
    inodes = set()
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                match = re.fullmatch(r"socket:\[([0-9]+)\]", os.readlink(f"/proc/{pid}/fd/{fd}"))
                if match:
                    inodes.add(match[1])
        except OSError:
            continue
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == LISTEN and fields[9] in inodes:
                address, port = fields[1].split(":")
                found.append((_address(address), int(port, 16)))
    return sorted(set(found))


def _address(hex_words: str) -> str:
    """/proc/net/tcp's address: 32-bit words, each in host (little-endian) order."""
    raw = b"".join(bytes.fromhex(hex_words[i : i + 8])[::-1] for i in range(0, len(hex_words), 8))
    return str(ipaddress.ip_address(raw))


def is_loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    mapped = getattr(ip, "ipv4_mapped", None)
    return (mapped or ip).is_loopback


def non_loopback_addresses() -> list[str]:
    """This machine's own addresses on its other interfaces (IPv4, and IPv6 but link-local)."""
    found = set()
    lines = Path("/proc/net/fib_trie").read_text().splitlines()
    for previous, line in zip(lines, lines[1:], strict=False):
        if line.strip() == "/32 host LOCAL":
            found.add(previous.split()[-1])
    for line in Path("/proc/net/if_inet6").read_text().splitlines():
        found.add(str(ipaddress.IPv6Address(bytes.fromhex(line.split()[0]))))
    return sorted(a for a in found if not is_loopback(a) and not ipaddress.ip_address(a).is_link_local)


def reachable(address: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.settimeout(2)
        try:
            sock.connect((address, port))
        except OSError:
            return False
        return True


def wait_serving(url: str, process: subprocess.Popen, timeout: float = 120) -> None:
    """Until ``url`` answers 200, while ``process`` runs."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and process.poll() is None:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            time.sleep(0.3)
    raise AssertionError(f"{url} was never served (status {process.poll()})")
