"""How `dlinfra check` shows what it found: a terminal summary, JSON for tooling, SARIF 2.1.0 for code scanning."""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Mapping
from typing import Any

from rich.console import Console
from rich.table import Table

from dlinfra import __version__
from dlinfra.checks.runner import CheckRun, Finding

SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
SCHEMA = "dlinfra.check/v1"  # `dlinfra check --json` (docs/json.md)
CHECKOV_DOCS = "https://www.checkov.io/5.Policy%20Index/all.html"


REACH_DOCS = "https://github.com/lab-example/dlinfra/blob/main/docs/reachability.md"
LIMITS_DOCS = "https://github.com/lab-example/dlinfra/blob/main/docs/limits.md"


def print_summary(run: CheckRun, console: Console) -> None:
    """Rule and framework tables, then every blocking finding and advisory, then notes."""
    counts = Counter(f.rule for f in run.findings if f.tool == "crossguard")
    rules_table = Table(title=f"CrossGuard rules over {len(run.stacks)} plan(s): {', '.join(run.stacks)}")
    for column in ("rule", "level", "violations", "result"):
        rules_table.add_column(column)
    for rule in run.rules:
        hits = counts.get(rule.name, 0)
        verdict = "pass" if not hits else ("FAIL" if rule.level == "mandatory" else "warn")
        rules_table.add_row(rule.name, rule.level, str(hits), verdict)
    console.print(rules_table)
    if run.checkov:
        table = Table(title="checkov")
        for column in ("framework", "version", "resources", "checks", "passed", "failed", "skipped"):
            table.add_column(column, justify="right" if column not in ("framework", "version") else "left")
        for s in run.checkov:
            table.add_row(
                s.framework, s.version, str(s.resources), str(s.checks), str(s.passed), str(s.failed), str(s.skipped)
            )
        console.print(table)
    if run.reach is not None:
        print_reach({**run.reach, "failures": []}, console)
    if run.limits is not None:
        print_limits(run.limits, console)
    shown = [f for f in run.findings if f.level != "skipped"]
    if shown:
        # One finding per two lines rather than a table: messages are long and CI logs are narrow.
        console.print("\n[bold]Findings[/]")
        for f in sorted(shown, key=lambda f: (not f.blocking, f.tool, f.rule, f.stack, f.label)):
            where = f"{f.location[0]}:{f.location[1]}" if f.location[0] else ""
            console.print(f"{f.level.upper():9} {f.rule}  {f.stack or '-'}  {f.label}  {where}", markup=False)
            console.print(f"          {f.message}", markup=False)
    skipped = [f for f in run.findings if f.level == "skipped"]
    if skipped:
        console.print(f"{len(skipped)} checkov failure(s) skipped by the skips file (reasons in --json and SARIF)")
    for note in run.notes:
        console.print(f"note: {note}", markup=False)
    blocking = sum(f.blocking for f in run.findings)
    console.print(f"[bold]{'FAILED' if blocking else 'passed'}[/]: {blocking} blocking finding(s)")


def _finding_json(f: Finding) -> dict[str, Any]:
    return {
        "tool": f.tool,
        "rule": f.rule,
        "title": f.title,
        "level": f.level,
        "blocking": f.blocking,
        "stack": f.stack,
        "resource": f.resource,
        "label": f.label,
        "message": f.message,
        "reason": f.reason,
        "guideline": f.guideline,
        "location": {"path": f.location[0], "line": f.location[1]} if f.location[0] else None,
    }


def to_json(run: CheckRun) -> dict[str, Any]:
    """Everything the run found, for tooling."""
    return {
        "schema": SCHEMA,
        "stacks": run.stacks,
        "exit_code": run.exit_code,
        "rules": [{"name": r.name, "level": r.level, "description": r.description} for r in run.rules],
        "checkov": [s.__dict__ for s in run.checkov],
        "findings": [_finding_json(f) for f in run.findings],
        "notes": run.notes,
        "reach": run.reach,
        "limits": run.limits,
    }


def _sarif_level(f: Finding) -> str:
    return "error" if f.blocking else ("warning" if f.level == "advisory" else "note")


def _fingerprint(f: Finding) -> str:
    """Stable across runs, so code scanning tracks one alert per rule and resource."""
    return hashlib.sha256(f"{f.tool}|{f.rule}|{f.resource}|{f.message}".encode()).hexdigest()


def to_sarif(run: CheckRun) -> dict[str, Any]:
    """SARIF 2.1.0 with two runs: dlinfra's CrossGuard rules and checkov; skipped checks as suppressed results."""
    runs = []
    for tool in ("crossguard", "checkov", "reach", "limits"):
        findings = [f for f in run.findings if f.tool == tool]
        rule_meta: dict[str, tuple[str, str]]
        if tool == "crossguard":
            rule_meta = {r.name: (r.description, r.level) for r in run.rules}
            driver: dict[str, Any] = {
                "name": "dlinfra-crossguard",
                "version": __version__,
                "informationUri": "https://www.pulumi.com/docs/iac/crossguard/",
            }
        elif tool == "reach":
            if run.reach is None:
                continue
            rule_meta = {
                f.rule: (f"reachability intents of family {f.rule.removeprefix('reach-')}", "mandatory")
                for f in findings
            }
            driver = {"name": "dlinfra-reach", "version": __version__, "informationUri": REACH_DOCS}
        elif tool == "limits":
            if run.limits is None:
                continue
            rule_meta = {f.rule: (f.title, "advisory") for f in findings}
            driver = {"name": "dlinfra-limits", "version": __version__, "informationUri": LIMITS_DOCS}
        else:
            rule_meta = {f.rule: (f.title, "failed") for f in findings}
            version = run.checkov[0].version if run.checkov else "unknown"
            driver = {"name": "checkov", "version": version, "informationUri": CHECKOV_DOCS}
        rule_ids = sorted(rule_meta)
        driver["rules"] = [
            {
                "id": rule_id,
                "shortDescription": {"text": rule_meta[rule_id][0]},
                "defaultConfiguration": {"level": "warning" if rule_meta[rule_id][1] == "advisory" else "error"},
                **({"helpUri": g} if (g := _guideline(findings, rule_id)) else {}),
            }
            for rule_id in rule_ids
        ]
        runs.append(
            {
                "tool": {"driver": driver},
                "results": [_sarif_result(f, rule_ids.index(f.rule)) for f in findings if f.rule in rule_meta],
            }
        )
    return {"$schema": SARIF_SCHEMA, "version": "2.1.0", "runs": runs}


def _guideline(findings: list[Finding], rule_id: str) -> str:
    return next((f.guideline for f in findings if f.rule == rule_id and f.guideline), "")


def _sarif_result(f: Finding, index: int) -> dict[str, Any]:
    path, line = f.location if f.location[0] else ("Pulumi.yaml", 1)
    result: dict[str, Any] = {
        "ruleId": f.rule,
        "ruleIndex": index,
        "level": _sarif_level(f),
        "message": {"text": f"{f.stack or 'manifests'}: {f.label}: {f.message}"},
        "locations": [
            {
                "physicalLocation": {
                    "artifactLocation": {"uri": path},
                    "region": {"startLine": max(line, 1)},
                },
                "logicalLocations": [{"fullyQualifiedName": f.resource or f.label, "kind": "resource"}],
            }
        ],
        "partialFingerprints": {"dlinfraFinding/v1": _fingerprint(f)},
        "properties": {"stack": f.stack, "tool": f.tool},
    }
    if f.level == "skipped":
        result["suppressions"] = [{"kind": "external", "justification": f.reason}]
    return result


def print_reach(summary: dict[str, Any], console: Console, *, verbose: bool = False, explain: bool = False) -> None:
    """The per-family table with the share of each family's packets proved, what the model refused, each failing
    flow with a packet that shows it and the hop where it stopped, and (explain) every allowed flow's paths."""
    table = Table(title="Reachability over the plans (dlinfra reach)")
    for column in ("family", "intents", "flows", "packets", "proved", "failed intents"):
        table.add_column(column, justify="left" if column == "family" else "right")
    per_family: dict[str, list[int]] = {}
    for row in summary["coverage"].values():
        counts = per_family.setdefault(row["family"], [0, 0])
        counts[0] += row["packets"]
        counts[1] += row["proved"]
    for family, row in summary["families"].items():
        packets, proved = per_family.get(family, [0, 0])
        table.add_row(
            family,
            str(row["intents"]),
            str(row["flows"]),
            f"{packets:.3g}",
            _share(proved, packets),
            str(row["failed_intents"]),
        )
    console.print(table)
    for refused in summary["refused"]:
        console.print(f"REFUSED {refused['stack']}: {refused['reason']}", markup=False)
    for f in summary["failures"]:
        packet = f["packet"]
        shown = _packet_text(packet) if packet else f"{f['protocol']}/{f['port']}"
        console.print(
            f"FAIL {f['intent']}: {f['source']} -> {f['destination']} {f['ports']} "
            f"({_share(round(f['share'] * 1e6), 10**6)} of the pair's packets), e.g. {shown}",
            markup=False,
        )
        console.print(f"     {f['reason']}", markup=False)
        if verbose:
            for hop in f["hops"]:
                console.print(f"       . {hop}", markup=False)
    if explain:
        for e in summary["explained"]:
            state = "allowed" if e["allowed"] else "partly allowed" if e["paths"] else "denied"
            console.print(f"{state}: {e['intent']}: {e['source']} -> {e['destination']}", markup=False)
            for path in e["paths"]:
                console.print(f"   {path['packets']:.3g} packets, e.g. {_packet_text(path['packet'])}", markup=False)
                for hop in path["hops"]:
                    console.print(f"       . {hop}", markup=False)
    failed = summary["failed_intents"] - (1 if summary["refused"] else 0)
    console.print(
        f"{summary['intents']} intents ({summary['intents'] - failed} proved), {summary['flows']} flows, "
        f"{summary['packets']:.3g} packets: {_share(summary['proved_packets'], summary['packets'])} as expected, "
        f"{summary['failed_flows']} failing flows, {len(summary['refused'])} refused "
        + (
            "(unchanged network and flows: the last proof reused)"
            if summary.get("cached")
            else f"({summary['seconds']} s)"
        ),
        markup=False,
    )


def _share(part: int, whole: int) -> str:
    if not whole:
        return "-"
    if part == whole:
        return "100%"
    text = f"{100 * part / whole:.4f}".rstrip("0").rstrip(".")
    return "99.9999%" if text == "100" else f"{text}%"


def _packet_text(packet: Mapping[str, Any] | None) -> str:
    if not packet:
        return "-"
    if packet["protocol"] == "icmp":
        return f"{packet['source']} -> {packet['destination']} icmp"
    return (
        f"{packet['source']}:{packet['source_port']} -> {packet['destination']}:{packet['destination_port']} "
        f"{packet['protocol']}"
    )


def print_limits(summary: dict[str, Any], console: Console) -> None:
    """One line per quota: the highest count of any scope against it, its default, whether AWS raises it and its
    Service Quotas code (where the count is, and every count that approaches or exceeds a quota: the findings)."""
    near = round(100 * summary["near_share"])
    console.print(
        f"\n[bold]Quotas and capacity[/], every pool at its maximum size (pages read {summary['read_on']}; "
        f"reported from {near}%)"
    )
    # Plain lines rather than a table, like the findings: CI logs are narrow and a table would fold every name.
    for row in summary["quotas"]:
        peak = row["peak"]
        if row["over"]:
            result = f"FAIL ({row['over']})" if not row["adjustable"] else f"over ({row['over']})"
        elif row["near"]:
            result = f"near ({row['near']})"
        else:
            result = "ok" if peak else "-"
        use = "-" if peak is None else f"{peak['used']}/{peak['limit']}{' raised' if peak['raised'] else ''}"
        default = "subnet size - 5" if row["default"] is None else f"default {row['default']}"
        code = f"{row['service']}/{row['code']}" if row["code"] else "no code"
        adjustable = "adjustable" if row["adjustable"] else "not adjustable"
        console.print(
            f"  {result:9} {use:>18}  {row['key']:34} {default}, {adjustable}, {code}", markup=False, highlight=False
        )
