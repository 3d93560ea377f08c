"""`dlinfra check`: the CrossGuard rules and checkov over the offline plans (and rendered manifests)."""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

from dlinfra.checks import checkov, skips, tfplan
from dlinfra.checks.limits import check as limits
from dlinfra.checks.plans import Plan
from policy.dlinfra_policy.rules.catalog import RULES
from policy.dlinfra_policy.rules.core import Context, Resource, ResourceRule, StackRule
from policy.dlinfra_policy.rules.network import vpcs_disjoint

Tool = Literal["crossguard", "checkov", "reach", "limits"]
MANIFEST_SUFFIXES = (".yaml", ".yml", ".json")


@dataclass(frozen=True)
class Finding:
    """A rule violation or a failed checkov check on one resource."""

    tool: Tool
    rule: str  # rule name (crossguard) or check id (checkov)
    title: str  # what the rule or check asks for
    level: str  # crossguard, reach and limits: mandatory | advisory; checkov: failed | skipped
    stack: str  # stack name, or "" for rendered manifests
    resource: str  # URN when known, else the Terraform address or Kubernetes id
    label: str  # short name for tables: `type name`
    message: str
    reason: str = ""  # why a checkov failure is skipped
    guideline: str = ""
    location: tuple[str, int] = ("", 0)  # repository file and line that declares the resource

    @property
    def blocking(self) -> bool:
        """Fails the check: a mandatory rule, or a checkov failure that is not skipped."""
        return self.level in ("mandatory", "failed")


@dataclass(frozen=True)
class FrameworkSummary:
    """What one checkov framework ran, for the report."""

    framework: str
    version: str
    resources: int  # resources at least one check ran on
    checks: int
    passed: int
    failed: int
    skipped: int


@dataclass
class CheckRun:
    """Everything `dlinfra check` found."""

    stacks: list[str]
    rules: Sequence[ResourceRule | StackRule]
    findings: list[Finding] = field(default_factory=list)
    checkov: list[FrameworkSummary] = field(default_factory=list)
    checked: dict[str, int] = field(default_factory=dict)  # stack -> checkov results on its export
    notes: list[str] = field(default_factory=list)
    reach: dict[str, Any] | None = None  # `dlinfra reach` summary (counts, timing) when it ran
    limits: dict[str, Any] | None = None  # quotas and capacity: dlinfra.checks.limits.summary_json

    @property
    def exit_code(self) -> int:
        """1 when anything blocking was found, else 0."""
        return 1 if any(f.blocking for f in self.findings) else 0


class SourceIndex:
    """Where each component is declared, so a finding can point at a file in the repository."""

    def __init__(self, root: Path) -> None:
        self.root = root

    @cached_property
    def _components(self) -> Mapping[str, tuple[str, int]]:
        found: dict[str, tuple[str, int]] = {}
        pattern = re.compile(r"""["'](dlinfra:[A-Za-z0-9_]+:[A-Za-z0-9_]+)["']""")
        for folder in ("components", "stacks"):
            for path in sorted((self.root / folder).glob("*.py")):
                for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
                    for token in pattern.findall(line):
                        found.setdefault(token, (path.relative_to(self.root).as_posix(), number))
        return found

    def locate(self, urn: str) -> tuple[str, int]:
        """The component that declares a resource (its nearest dlinfra:* ancestor), else the stack program."""
        chain = urn.split("::")[2].split("$") if urn.count("::") >= 3 else []
        for token in reversed(chain):
            if token in self._components:
                return self._components[token]
        return ("stacks/__main__.py", 1)


@dataclass(frozen=True)
class CheckOptions:
    """Inputs of one `dlinfra check`."""

    root: Path  # the project (for checkov's venv and source locations)
    plans: Sequence[Plan]
    context: Context
    skips: Sequence[skips.Skip]
    manifests: Path  # rendered Kubernetes manifests (may be absent)
    export_dir: Path  # where the Terraform-plan exports are written for checkov
    checkov: Path | None  # checkov executable; None runs the CrossGuard rules only
    cache: Path | None = None  # checkov's results by file content (build/cache); None: every file scanned again


def _label(resource: Resource) -> str:
    return f"{resource.type} {resource.name}"


def run_rules(plans: Sequence[Plan], ctx: Context, sources: SourceIndex) -> list[Finding]:
    """Every rule over every plan; and, across plans, that no two stacks' VPCs overlap."""
    out: list[Finding] = []
    for plan in plans:
        resources = plan.rule_resources()
        by_urn = {r.urn: r for r in resources}
        for rule in RULES:
            if isinstance(rule, ResourceRule):
                hits = [(r.urn, msg) for r in resources for msg in rule.check(r, ctx)]
            else:
                hits = list(rule.check(resources, ctx))
            for urn, message in hits:
                resource = by_urn.get(urn)
                out.append(
                    Finding(
                        tool="crossguard",
                        rule=rule.name,
                        title=rule.description,
                        level=rule.level,
                        stack=plan.stack,
                        resource=urn,
                        label=_label(resource) if resource else urn,
                        message=message,
                        location=sources.locate(urn),
                    )
                )
    # Each stack's run compared its VPCs with the plan and with each other; this compares stacks' VPCs.
    everything = [r for plan in plans for r in plan.rule_resources()]
    for urn, message in vpcs_disjoint(everything, across_stacks_only=True):
        resource = next(r for r in everything if r.urn == urn)
        out.append(
            Finding(
                tool="crossguard",
                rule="vpc-cidr-planned",
                title="VPC CIDRs are disjoint across all stacks",
                level="mandatory",
                stack=resource.stack,
                resource=urn,
                label=_label(resource),
                message=message,
                location=sources.locate(urn),
            )
        )
    return out


def _manifest_files(folder: Path) -> list[Path]:
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix in MANIFEST_SUFFIXES)


def run_checks(options: CheckOptions) -> CheckRun:
    """The CrossGuard rules, then checkov on the Terraform-plan exports and on rendered manifests."""
    sources = SourceIndex(options.root)
    run = CheckRun(stacks=[p.stack for p in options.plans], rules=RULES)
    run.findings += run_rules(options.plans, options.context, sources)
    if options.checkov is None:
        run.notes.append("checkov not run (--no-checkov): only the CrossGuard rules were checked")
        return run
    exports = {p.stack: tfplan.export(p.data, source=str(p.path)) for p in options.plans}
    options.export_dir.mkdir(parents=True, exist_ok=True)
    files: dict[str, str] = {}  # export file -> stack
    for stack, export in exports.items():
        path = (options.export_dir / f"{stack}.tfplan.json").resolve()
        path.write_text(json.dumps(export.document, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        files[str(path)] = stack
    used: set[skips.Skip] = set()
    exported = {stack: bool(e.addresses) for stack, e in exports.items()}
    targets = [Path(f) for f, stack in files.items() if exported[stack]]
    if targets:
        report = _checkov("terraform_plan", targets, options, cwd=options.export_dir)
        checked = Counter(r.file for r in report.results)
        # checkov drops a file it cannot read without a word; every export must have been checked.
        blind = [files[str(t)] for t in targets if not checked[str(t)]]
        if blind:
            raise checkov.CheckovError(f"checkov evaluated no check on the plan export of {', '.join(blind)}")
        run.checked = {files[f]: n for f, n in checked.items()}
        run.checkov.append(_consume(run, report, options.skips, used, files, exports, sources))
    else:
        run.notes.append("no cloud resources in the selected plans: checkov terraform_plan not run")
    kubernetes = sorted({stack for stack, e in exports.items() if e.kubernetes})
    manifests = _manifest_files(options.manifests)
    if manifests:
        report = (
            checkov.run("kubernetes", directory=options.manifests.resolve(), checkov=options.checkov)
            if options.cache is None
            else _checkov("kubernetes", [m.resolve() for m in manifests], options)
        )
        run.checkov.append(_consume(run, report, options.skips, used, {}, {}, sources, options.root))
    elif kubernetes:
        message = (
            f"plans of {', '.join(kubernetes)} declare Kubernetes objects but {options.manifests}/ has no rendered "
            "manifests, so checkov's kubernetes scan cannot run"
        )
        run.findings.append(
            Finding("checkov", "kubernetes-manifests", "Rendered manifests exist", "failed", "", "", "", message)
        )
    else:
        run.notes.append(
            f"no rendered Kubernetes manifests ({options.manifests}/ absent or empty): kubernetes scan not run"
        )
    for skip in options.skips:
        if skip not in used:
            run.notes.append(f"skip {skip.check_id} matched nothing; remove it from the skips file if it is stale")
    return run


def _checkov(
    framework: str, files: list[Path], options: CheckOptions, cwd: Path | None = None
) -> checkov.CheckovReport:
    assert options.checkov is not None
    if options.cache is None:
        return checkov.run(framework, files=files, checkov=options.checkov, cwd=cwd)
    return checkov.run_cached(framework, files, checkov=options.checkov, cache=options.cache, cwd=cwd)


def _consume(
    run: CheckRun,
    report: checkov.CheckovReport,
    skip_list: Sequence[skips.Skip],
    used: set[skips.Skip],
    files: Mapping[str, str],
    exports: Mapping[str, tfplan.TerraformPlan],
    sources: SourceIndex,
    root: Path | None = None,
) -> FrameworkSummary:
    """Turn a checkov report into findings (failures, skipped or not) and a summary row."""
    skipped = 0
    for result in report.results:
        if result.passed:
            continue
        skip = skips.find_skip(skip_list, report.framework, result.check_id, result.resource)
        stack = files.get(result.file, "")
        urn = exports[stack].addresses.get(result.resource, "") if stack in exports else ""
        if urn:
            location = sources.locate(urn)
        elif root is not None and Path(result.file).is_relative_to(root.resolve()):
            location = (Path(result.file).relative_to(root.resolve()).as_posix(), max(result.lines[0], 1))
        else:
            location = ("", 0)
        if skip is not None:
            used.add(skip)
            skipped += 1
        run.findings.append(
            Finding(
                tool="checkov",
                rule=result.check_id,
                title=result.check_name,
                level="skipped" if skip else "failed",
                stack=stack,
                resource=urn or result.resource,
                label=result.resource,
                message=result.check_name,
                reason=skip.reason if skip else "",
                guideline=result.guideline,
                location=location,
            )
        )
    return FrameworkSummary(
        framework=report.framework,
        version=report.version,
        resources=len({(r.file, r.resource) for r in report.results}),  # the same whether results were cached or not
        checks=report.checks,
        passed=report.passed,
        failed=report.failed - skipped,
        skipped=skipped,
    )


def reach_findings(summary: Mapping[str, Any]) -> list[Finding]:
    """One blocking finding per failed reachability intent, naming its first failing flow and the hop."""
    by_intent: dict[str, list[Mapping[str, Any]]] = {}
    for failure in summary["failures"]:
        by_intent.setdefault(failure["intent"], []).append(failure)
    out = []
    for intent, failures in sorted(by_intent.items()):
        first = failures[0]
        more = f" (and {len(failures) - 1} more flow(s) of this intent)" if len(failures) > 1 else ""
        verb = "must be open" if first["expect"] == "allow" else "must stay closed"
        out.append(
            Finding(
                tool="reach",
                rule=f"reach-{first['family']}",
                title=f"flow {verb}: {intent}",
                level="mandatory",
                stack=intent.split("/")[1] if intent.count("/") >= 1 and "-" in intent.split("/")[1] else "",
                resource=first["resource"],
                label=f"{first['source']} -> {first['destination']} {first['ports']}",
                message=f"{first['reason']}{more}; e.g. {_packet(first['packet'])}",
                guideline=first["requirement"],
            )
        )
    for refused in summary.get("refused") or []:
        out.append(
            Finding(
                tool="reach",
                rule=f"reach-{refused.get('kind', 'ipv6')}",
                title=f"not modelled: {refused['name']}",
                level="mandatory",
                stack=refused["stack"],
                resource=refused["resource"],
                label=refused["what"],
                message=refused["reason"],
                guideline="docs/reachability.md",
            )
        )
    return out


def _packet(packet: Mapping[str, Any] | None) -> str:
    if not packet:
        return "no packet"
    return (
        f"{packet['source']}:{packet['source_port']} -> {packet['destination']}:{packet['destination_port']} "
        f"{packet['protocol']}"
    )


def limit_findings(result: limits.Limits, sources: SourceIndex) -> list[Finding]:
    """One finding per count that approaches or exceeds its quota; blocking only over a quota AWS will not raise."""
    return [
        Finding(
            tool="limits",
            rule=f"limit-{v.quota.key}",
            title=v.quota.name,
            level="mandatory" if v.blocking else "advisory",
            stack=v.usage.stack,
            resource=v.usage.resource or v.usage.scope,
            label=v.usage.scope,
            message=v.message(),
            guideline="https://" + v.quota.source.split("https://", 1)[-1],
            location=sources.locate(v.usage.resource) if v.usage.resource else ("", 0),
        )
        for v in result.reported
    ]
