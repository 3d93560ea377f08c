"""Static checks of chef/ for mistakes Chef would only report at converge time, on the node.

Chef cannot be installed here, so the cookbooks are read as text. Run: python -m dlinfra.checks.chef [dir]
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

# Top-level keys Ohai fills in automatically; reads below them have no cookbook default by design.
OHAI_KEYS = frozenset(
    {
        "block_device",
        "chef_packages",
        "cloud",
        "command",
        "cpu",
        "current_user",
        "dmi",
        "domain",
        "ec2",
        "filesystem",
        "fqdn",
        "hostname",
        "init_package",
        "ip6address",
        "ipaddress",
        "kernel",
        "keys",
        "languages",
        "lsb",
        "machine_id",
        "machinename",
        "macaddress",
        "memory",
        "network",
        "os",
        "os_version",
        "packages",
        "platform",
        "platform_family",
        "platform_version",
        "root_group",
        "shard_seed",
        "shells",
        "time",
        "uptime",
        "uptime_seconds",
        "virtualization",
    }
)

_KEY = r"""\[\s*(?:'[^'\\]*'|"[^"\\#]*"|:[A-Za-z_]\w*)\s*\]"""
_CHAIN = rf"((?:{_KEY})+)"
_NODE_READ = re.compile(rf"(?<![\w.@$:])node{_CHAIN}")
_ATTR_DEF = re.compile(
    rf"^\s*(?:node\.)?(?:default|override|normal|force_default|force_override){_CHAIN}\s*(?:\|\|=|<<|=(?!=))\s*(.*)$"
)
_ALIAS = re.compile(rf"^\s*([a-z_]\w*)\s*=\s*node{_CHAIN}\s*$")
_KEY_PARTS = re.compile(r"""'([^'\\]*)'|"([^"\\#]*)"|:([A-Za-z_]\w*)""")
_INCLUDE = re.compile(r"""\binclude_recipe\s*\(?\s*(['"])([^'"#]+)\1""")
_BLOCK_START = re.compile(r"^(\s*)(template|cookbook_file)\s+(.+?)\s+do\s*(?:\|\w+\|)?\s*$")
_LITERAL = re.compile(r"""^(['"])([^'"#]*)\1$""")
_PROPERTY = re.compile(r"""^\s*(source|cookbook)\s*\(?\s*(['"])(.+?)\2""")
_INTERPOLATION = re.compile(r"#\{[^}]*\}")
_ERB_TAG = re.compile(r"<%(?!%)[=-]?(.*?)-?%>", re.DOTALL)
_TEMPLATE_VAR = re.compile(r"@([a-z_]\w*)")
# recipe[cb], recipe[cb::r], recipe[cb::r@1.2.3], role[name], or a bare cb / cb::r (a recipe).
# Keys of a node attribute file (cinc-client -j) that are not attributes.
_NODE_FILE_KEYS = frozenset({"run_list", "name", "chef_environment", "json_class", "chef_type"})
_RUN_LIST_ENTRY = re.compile(r"^(?:(recipe|role)\[([^\]\s]+)\]|([A-Za-z0-9_-]+(?:::[A-Za-z0-9_-]+)?(?:@[\d.]+)?))$")


@dataclass(frozen=True, order=True)
class Finding:
    """One defect: file (relative to the chef root), line and what is wrong."""

    path: str
    line: int
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.message}"


@dataclass
class Cookbook:
    """What the checks need to know about one cookbook."""

    name: str
    root: Path
    depends: set[str] = field(default_factory=set)

    def has_recipe(self, recipe: str) -> bool:
        return (self.root / "recipes" / f"{recipe}.rb").is_file()

    def find(self, kind: str, source: str) -> Path | None:
        """The template or cookbook file `source` under templates/ or files/ (root or default/).

        A source built by interpolation ("site/#{name}") matches when any file fits its pattern.
        """
        pattern = _INTERPOLATION.sub("*", source)
        for base in (self.root / kind, self.root / kind / "default"):
            if pattern != source:
                matches = sorted(p for p in base.glob(pattern) if p.is_file())
                if matches:
                    return matches[0]
            elif (base / source).is_file():
                return base / source
        return None


@dataclass(frozen=True)
class _Definition:
    path: tuple[str, ...]
    hash_literal: bool  # the value is a Ruby hash literal, so deeper keys may live inside it


# The checks: every attribute a recipe, library or template reads has a default in some cookbook's
# attributes/, and every attribute a role or node file sets exists; every template and cookbook_file a
# recipe names exists, and every @variable a template uses is passed to it; every include_recipe target
# exists in a cookbook the includer depends on; every run list entry in roles, nodes and kitchen*.yml
# names an existing recipe or role, and roles do not include each other in a cycle.
def check(chef_root: Path) -> list[Finding]:
    """Every finding for the Chef repository at `chef_root`, sorted by file and line."""
    checker = _Checker(chef_root)
    return sorted(checker.run())


class _Checker:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.findings: list[Finding] = []
        self.cookbooks: dict[str, Cookbook] = {}
        self.definitions: list[_Definition] = []

    def run(self) -> list[Finding]:
        self._load_cookbooks()
        self._load_definitions()
        for cookbook in self.cookbooks.values():
            for path in sorted(cookbook.root.rglob("*.rb")):
                if path.parent.name in {"recipes", "attributes", "libraries", "resources"}:
                    self._check_ruby(cookbook, path)
            for path in sorted((cookbook.root / "templates").rglob("*.erb")):
                self._check_reads(path, _erb_code(path.read_text(encoding="utf-8")))
        self._check_run_lists()
        return self.findings

    # -- loading -------------------------------------------------------------------------------------
    def _load_cookbooks(self) -> None:
        for parent in (self.root / "cookbooks", self.root / "test" / "cookbooks"):
            if not parent.is_dir():
                continue
            for directory in sorted(p for p in parent.iterdir() if p.is_dir()):
                metadata = directory / "metadata.rb"
                if not metadata.is_file():
                    self._add(directory, 1, "cookbook directory has no metadata.rb")
                    continue
                text = metadata.read_text(encoding="utf-8")
                name_match = re.search(r"""^\s*name\s+['"]([^'"]+)['"]""", text, re.MULTILINE)
                name = name_match.group(1) if name_match else directory.name
                if name != directory.name:
                    self._add(metadata, 1, f"metadata name {name!r} differs from directory {directory.name!r}")
                if name in self.cookbooks:
                    self._add(metadata, 1, f"cookbook {name!r} is defined twice")
                depends = set(re.findall(r"""^\s*depends\s+['"]([^'"]+)['"]""", text, re.MULTILINE))
                self.cookbooks[name] = Cookbook(name=name, root=directory, depends=depends)

    def _load_definitions(self) -> None:
        for cookbook in self.cookbooks.values():
            for path in sorted((cookbook.root / "attributes").glob("*.rb")):
                for _, line in _code_lines(path.read_text(encoding="utf-8")):
                    match = _ATTR_DEF.match(line)
                    if match:
                        keys = _keys(match.group(1))
                        self.definitions.append(_Definition(keys, match.group(2).lstrip().startswith("{")))

    # -- attribute reads -----------------------------------------------------------------------------
    def _defined(self, read: tuple[str, ...]) -> bool:
        if read[0] in OHAI_KEYS:
            return True
        for definition in self.definitions:
            if definition.path[: len(read)] == read:
                return True
            if definition.hash_literal and read[: len(definition.path)] == definition.path:
                return True
        return False

    def _check_reads(self, path: Path, lines: Iterable[tuple[int, str]]) -> None:
        aliases: dict[str, tuple[str, ...]] = {}
        for number, line in lines:
            alias = _ALIAS.match(line)
            if alias:
                aliases[alias.group(1)] = _keys(alias.group(2))
            reads = [_keys(m.group(1)) for m in _NODE_READ.finditer(line)]
            for name, prefix in aliases.items():
                pattern = re.compile(rf"(?<![\w.@$:]){re.escape(name)}{_CHAIN}")
                reads.extend(prefix + _keys(m.group(1)) for m in pattern.finditer(line))
            for read in reads:
                if not self._defined(read):
                    attribute = "".join(f"['{k}']" for k in read)
                    self._add(path, number, f"node{attribute} has no default in any cookbook's attributes/")

    # -- recipes: templates, files, includes -----------------------------------------------------------
    def _check_ruby(self, cookbook: Cookbook, path: Path) -> None:
        lines = _code_lines(path.read_text(encoding="utf-8"))
        self._check_reads(path, lines)
        if path.parent.name not in {"recipes", "resources"}:
            return
        for number, line in lines:
            for match in _INCLUDE.finditer(line):
                self._check_include(cookbook, path, number, match.group(2))
        for start, kind, name, body in _resource_blocks(lines):
            self._check_source(cookbook, path, start, kind, name, body)

    def _check_include(self, cookbook: Cookbook, path: Path, line: int, target: str) -> None:
        name, _, recipe = target.partition("::")
        other = self.cookbooks.get(name)
        if other is None:
            self._add(path, line, f"include_recipe {target!r}: no cookbook {name!r}")
            return
        if not other.has_recipe(recipe or "default"):
            self._add(path, line, f"include_recipe {target!r}: {name} has no recipes/{recipe or 'default'}.rb")
        if name != cookbook.name and name not in cookbook.depends:
            self._add(
                path,
                line,
                f"include_recipe {target!r}: add `depends '{name}'` to {cookbook.name}/metadata.rb",
            )

    def _check_source(
        self, cookbook: Cookbook, path: Path, start: int, kind: str, name: str, body: list[tuple[int, str]]
    ) -> None:
        properties = {m.group(1): m.group(3) for _, line in body if (m := _PROPERTY.match(line))}
        source = properties.get("source")
        if source is None:
            literal = _LITERAL.match(name)
            if not literal:
                self._add(path, start, f"{kind} {name}: name is not a literal, so give it an explicit source")
                return
            source = literal.group(2).rsplit("/", 1)[-1] + (".erb" if kind == "template" else "")
        owner_name = properties.get("cookbook", cookbook.name)
        owner = self.cookbooks.get(owner_name)
        folder = "templates" if kind == "template" else "files"
        if owner is None:
            self._add(path, start, f"{kind} {name}: no cookbook {owner_name!r}")
            return
        found = owner.find(folder, source)
        if found is None:
            self._add(path, start, f"{kind} {name}: {owner_name}/{folder}/{source} does not exist")
        elif kind == "template":
            self._check_variables(path, start, name, body, found)

    def _check_variables(self, path: Path, start: int, name: str, body: list[tuple[int, str]], template: Path) -> None:
        used = set(_TEMPLATE_VAR.findall(" ".join(code for _, code in _erb_code(template.read_text("utf-8")))))
        text = "\n".join(line for _, line in body)
        call = re.search(r"\bvariables\s*\(", text)
        if call is None:
            passed: set[str] = set()
        else:
            inner = _balanced(text, call.end() - 1)
            if inner is None or not re.match(r"\s*[a-z_]\w*:", inner):
                return  # variables built at converge time (lazy, a local hash): cannot be read here
            passed = set(re.findall(r"(?:^|[,({])\s*([a-z_]\w*):(?!:)", inner))
        missing = sorted(used - passed)
        if missing:
            names = ", ".join(f"@{v}" for v in missing)
            self._add(path, start, f"template {name}: {template.name} uses {names} but variables() does not pass it")

    # -- run lists -----------------------------------------------------------------------------------
    def _check_run_lists(self) -> None:
        role_files = sorted((self.root / "roles").glob("*.json"))
        known_roles = {path.stem for path in role_files}
        roles: dict[str, list[object]] = {}
        for path in role_files:
            data = self._load_json(path)
            if data is None:
                continue
            if data.get("name") != path.stem:
                self._add(path, 1, f"role name {data.get('name')!r} differs from file name {path.stem!r}")
            run_list = list(_as_list(data.get("run_list")))
            for env_list in dict(_as_dict(data.get("env_run_lists"))).values():
                run_list.extend(_as_list(env_list))
            roles[path.stem] = run_list
            self._check_entries(path, run_list, known_roles)
            for precedence in ("default_attributes", "override_attributes"):
                self._check_settings(path, _as_dict(data.get(precedence)), ())
        for path in sorted((self.root / "nodes").glob("*.json")):
            data = self._load_json(path)
            if data is not None:
                self._check_entries(path, _as_list(data.get("run_list")), known_roles)
                attributes = {k: v for k, v in data.items() if k not in _NODE_FILE_KEYS}
                self._check_settings(path, attributes, ())
        for kitchen in sorted(self.root.glob("kitchen*.yml")):
            config = yaml.safe_load(kitchen.read_text(encoding="utf-8")) or {}
            for suite in config.get("suites", []):
                self._check_entries(kitchen, _as_list(suite.get("run_list")), known_roles)
        self._check_role_cycles(roles)

    def _check_settings(self, path: Path, settings: Mapping[Any, object], prefix: tuple[str, ...]) -> None:
        """Every attribute a role or node file sets must exist: Chef silently ignores a misspelt one."""
        for key, value in settings.items():
            setting = (*prefix, str(key))
            if isinstance(value, dict):
                self._check_settings(path, value, setting)
            elif not self._defined(setting):
                attribute = "".join(f"['{k}']" for k in setting)
                self._add(
                    path,
                    _line_of(path.read_text(encoding="utf-8"), setting[-1]),
                    f"sets node{attribute}, which no cookbook's attributes/ defines (misspelt?)",
                )

    def _load_json(self, path: Path) -> dict[str, object] | None:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            self._add(path, exc.lineno, f"not valid JSON: {exc.msg}")
            return None
        if not isinstance(data, dict):
            self._add(path, 1, "expected a JSON object")
            return None
        return data

    def _check_entries(self, path: Path, entries: Sequence[object], known_roles: set[str]) -> None:
        text = path.read_text(encoding="utf-8")
        for entry in entries:
            line = _line_of(text, str(entry))
            match = _RUN_LIST_ENTRY.match(str(entry)) if isinstance(entry, str) else None
            if match is None:
                self._add(path, line, f"run list entry {entry!r} is neither recipe[...] nor role[...]")
                continue
            kind, target = match.group(1) or "recipe", match.group(2) or match.group(3)
            if kind == "role":
                if target not in known_roles:
                    self._add(path, line, f"run list entry {entry!r}: no roles/{target}.json")
                continue
            name, _, recipe = target.split("@", 1)[0].partition("::")
            cookbook = self.cookbooks.get(name)
            if cookbook is None:
                self._add(path, line, f"run list entry {entry!r}: no cookbook {name!r}")
            elif not cookbook.has_recipe(recipe or "default"):
                self._add(path, line, f"run list entry {entry!r}: {name} has no recipes/{recipe or 'default'}.rb")

    def _check_role_cycles(self, roles: dict[str, list[object]]) -> None:
        def nested(role: str) -> Iterator[str]:
            for entry in roles.get(role, []):
                match = _RUN_LIST_ENTRY.match(str(entry))
                if match and match.group(1) == "role":
                    yield match.group(2)

        reported: set[frozenset[str]] = set()

        def visit(role: str, trail: list[str]) -> None:
            for child in nested(role):
                if child in trail:
                    loop = trail[trail.index(child) :]
                    if frozenset(loop) not in reported:
                        reported.add(frozenset(loop))
                        # Start the report at the alphabetically first role, so it reads the same always.
                        first = loop.index(min(loop))
                        cycle = [*loop[first:], *loop[:first], min(loop)]
                        self._add(self.root / "roles" / f"{cycle[0]}.json", 1, f"role cycle: {' -> '.join(cycle)}")
                elif child in roles:
                    visit(child, [*trail, child])

        for role in sorted(roles):
            visit(role, [role])

    def _add(self, path: Path, line: int, message: str) -> None:
        try:
            shown = str(path.relative_to(self.root))
        except ValueError:
            shown = str(path)
        self.findings.append(Finding(shown, line, message))


def _keys(chain: str) -> tuple[str, ...]:
    return tuple(next(g for g in m.groups() if g is not None) for m in _KEY_PARTS.finditer(chain))


def _strip_comment(line: str) -> str:
    """The line without its Ruby comment; a # inside a string literal is kept."""
    quote: str | None = None
    escaped = False
    for i, char in enumerate(line):
        if escaped:
            escaped = False
        elif char == "\\" and quote:
            escaped = True
        elif quote:
            if char == quote:
                quote = None
        elif char in "'\"":
            quote = char
        elif char == "#":
            return line[:i]
    return line


def _code_lines(text: str) -> list[tuple[int, str]]:
    return [(n, _strip_comment(line)) for n, line in enumerate(text.splitlines(), start=1)]


def _erb_code(text: str) -> list[tuple[int, str]]:
    """Ruby code inside ERB tags, each with the line it starts on."""
    code: list[tuple[int, str]] = []
    for match in _ERB_TAG.finditer(text):
        first = text.count("\n", 0, match.start()) + 1
        for offset, line in enumerate(match.group(1).splitlines() or [""]):
            code.append((first + offset, _strip_comment(line)))
    return code


def _resource_blocks(lines: list[tuple[int, str]]) -> Iterator[tuple[int, str, str, list[tuple[int, str]]]]:
    """(line, kind, name expression, body lines) of each template/cookbook_file ... do ... end block."""
    for index, (number, line) in enumerate(lines):
        start = _BLOCK_START.match(line)
        if not start:
            continue
        end = re.compile(rf"^{re.escape(start.group(1))}end\b")
        body: list[tuple[int, str]] = []
        for later in lines[index + 1 :]:
            if end.match(later[1]):
                break
            body.append(later)
        yield number, start.group(2), start.group(3).strip(), body


def _balanced(text: str, open_index: int) -> str | None:
    """Text between the parenthesis at `open_index` and its partner, or None when unbalanced."""
    depth = 0
    for i in range(open_index, len(text)):
        if text[i] == "(":
            depth += 1
        elif text[i] == ")":
            depth -= 1
            if depth == 0:
                return text[open_index + 1 : i]
    return None


def _line_of(text: str, needle: str) -> int:
    index = text.find(f'"{needle}"')
    if index < 0:
        index = text.find(needle)
    return text.count("\n", 0, index) + 1 if index >= 0 else 1


def _as_list(value: object) -> list[object]:
    return list(value) if isinstance(value, list) else []


def _as_dict(value: object) -> dict[object, object]:
    return dict(value) if isinstance(value, dict) else {}


def main(argv: Sequence[str] | None = None) -> int:
    """Print every finding for the chef/ directory (default ./chef); exit 1 when there are any."""
    args = list(sys.argv[1:] if argv is None else argv)
    root = Path(args[0] if args else "chef")
    if not (root / "cookbooks").is_dir():
        print(f"{root}: not a Chef repository (no cookbooks/ directory)", file=sys.stderr)
        return 2
    findings = check(root)
    for finding in findings:
        print(f"{root}/{finding}")
    return 1 if findings else 0


if __name__ == "__main__":
    raise SystemExit(main())
