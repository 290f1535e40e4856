//! The agent configurations hypd ships in `playbooks/`: the Kiro CLI agent
//! `hypd-inst-agent`, a Claude Code subagent and a generic `.mcp.json`, each generated
//! from the command registry's own annotations (read-only, mutating, destructive), so a
//! new tool is auto-approved or gated alike in every client without editing three files.
//! A test regenerates them and fails on any difference from the committed files;
//! `hypd agent install` writes the Kiro agent where Kiro CLI looks, pointing at one server.
//! No token is ever written into a configuration: the bridge reads it from a file or the
//! environment.

use std::path::{Path, PathBuf};

use app::api::{COMMANDS, CommandSpec, Effect};
use serde_json::{Value, json};

/// The agent's name, as Kiro CLI selects it (`kiro-cli chat --agent hypd-inst-agent`).
pub const AGENT: &str = "hypd-inst-agent";
/// The MCP server's name in every client configuration.
pub const SERVER: &str = "hypd";

/// The playbooks, compiled in so `hypd agent install` works from any directory.
pub const PLAYBOOKS: &[(&str, &str)] = &[
    (
        "add-instance-group.md",
        include_str!("../../playbooks/add-instance-group.md"),
    ),
    (
        "create-cluster.md",
        include_str!("../../playbooks/create-cluster.md"),
    ),
    (
        "delete-safely.md",
        include_str!("../../playbooks/delete-safely.md"),
    ),
    (
        "deploy-inference-endpoint.md",
        include_str!("../../playbooks/deploy-inference-endpoint.md"),
    ),
    (
        "deploy-jumpstart-model.md",
        include_str!("../../playbooks/deploy-jumpstart-model.md"),
    ),
    (
        "deploy-model-server.md",
        include_str!("../../playbooks/deploy-model-server.md"),
    ),
    (
        "diagnose-failed-operation.md",
        include_str!("../../playbooks/diagnose-failed-operation.md"),
    ),
    (
        "diagnose-nccl.md",
        include_str!("../../playbooks/diagnose-nccl.md"),
    ),
    (
        "diagnose-node.md",
        include_str!("../../playbooks/diagnose-node.md"),
    ),
    (
        "download-model.md",
        include_str!("../../playbooks/download-model.md"),
    ),
    (
        "enable-features.md",
        include_str!("../../playbooks/enable-features.md"),
    ),
    (
        "submit-training-job.md",
        include_str!("../../playbooks/submit-training-job.md"),
    ),
];

/// A playbook as its front matter declares it (`key: value` lines between `---` lines)
/// and as its body opens (the H1 title, then a paragraph saying what it does). MCP's
/// prompts and the drift tests read playbooks through this one parse, so a field the
/// tests hold to a rule is the field clients see. Fields are optional here: which are
/// required, and in what form, is the tests' to say.
#[derive(Clone, Debug, PartialEq)]
pub struct Playbook<'a> {
    /// The file's name, e.g. `create-cluster.md`.
    pub file: &'a str,
    /// The file's stem: the name a playbook is known by (its MCP prompt's name).
    pub name: &'a str,
    /// The front matter's `playbook:`, which should be `name`.
    pub playbook: Option<&'a str>,
    /// `major.minor.patch`, with a changelog entry in the body.
    pub version: Option<&'a str>,
    /// `workflow` or `diagnostic`.
    pub kind: Option<&'a str>,
    /// What the user may have decided before the playbook starts (the playbook asks for
    /// whatever is missing), in declared order.
    pub arguments: Vec<&'a str>,
    /// A workflow's order of calls: phases separated by `>`, calls within one by `,`.
    pub flow: Option<&'a str>,
    /// The body's H1 heading.
    pub title: Option<&'a str>,
    /// The first paragraph after the title (what the playbook does), on one line.
    pub intro: Option<String>,
    /// Everything after the front matter.
    pub body: &'a str,
    /// The whole file, front matter included.
    pub text: &'a str,
}

impl<'a> Playbook<'a> {
    /// `text` read as the playbook in `file`; `None` when it opens with no front matter.
    pub fn parse(file: &'a str, text: &'a str) -> Option<Self> {
        let (front, body) = text
            .strip_prefix("---\n")
            .and_then(|t| t.split_once("\n---\n"))?;
        // The first line of a key wins, as a reader scanning from the top would take it.
        let field = |key: &str| {
            front.lines().find_map(|l| {
                l.strip_prefix(key)
                    .and_then(|rest| rest.strip_prefix(": "))
                    .map(str::trim)
            })
        };
        let title = body
            .lines()
            .find_map(|l| l.strip_prefix("# "))
            .map(str::trim);
        Some(Self {
            file,
            name: file.strip_suffix(".md").unwrap_or(file),
            playbook: field("playbook"),
            version: field("version"),
            kind: field("kind"),
            arguments: field("arguments")
                .map(|a| {
                    a.split(',')
                        .map(str::trim)
                        .filter(|a| !a.is_empty())
                        .collect()
                })
                .unwrap_or_default(),
            flow: field("flow"),
            title,
            intro: intro(body),
            body,
            text,
        })
    }
}

/// The first paragraph after the body's H1 heading, its lines joined by spaces.
fn intro(body: &str) -> Option<String> {
    let lines: Vec<&str> = body
        .lines()
        .skip_while(|l| !l.starts_with("# "))
        .skip(1)
        .skip_while(|l| l.trim().is_empty())
        .take_while(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .map(str::trim)
        .collect();
    (!lines.is_empty()).then(|| lines.join(" "))
}

/// The compiled playbooks, parsed, in `PLAYBOOKS` order; one without front matter is
/// left out (the drift test names it).
pub fn playbooks() -> impl Iterator<Item = Playbook<'static>> {
    PLAYBOOKS
        .iter()
        .filter_map(|(file, text)| Playbook::parse(file, text))
}

/// What the agent is told before anything else: the three workflow rules.
pub const PROMPT: &str = "You run GPU training and inference clusters on AWS through hypd's tools. \
Follow the playbook for the job (they are loaded as your resources) and three rules. \
(1) Inspect before you create: list what exists and query regions, zones, instance types, quotas and training plans (list_capacity), then offer the user choices. \
(2) Ask the user only decision-level questions (Availability Zone, instance type, capacity type, counts), never about CIDRs, route tables or security groups. \
(3) Follow every long operation to a final state with the status tool the mutating tool names (wait_operation), and report that state, never a submitted request as done. \
Show the plan (dry_run: true) before every change, and for a deletion send back the confirmation the first call returned only once the user agrees. \
When something fails, investigate read-only on your own (diagnose_operation) and offer its suggested commands for the user to approve; never run them unasked.";

/// The registry's commands an agent may call without asking, and those it must ask for.
fn split() -> (Vec<&'static CommandSpec>, Vec<&'static CommandSpec>) {
    COMMANDS
        .iter()
        .map(|c| &c.spec)
        .partition(|s| s.effect == Effect::ReadOnly)
}

/// The Kiro CLI agent, in the format both its engines read: `tools` and `allowedTools`
/// for 2.x, `permissions` rules for V3. `command` and `args` start the bridge;
/// `resources` are the playbooks' `file://` URIs.
pub fn kiro(command: &str, args: &[String], resources: &[String]) -> Value {
    let (read, gated) = split();
    let names = |specs: &[&CommandSpec], prefix: &str| -> Vec<String> {
        specs
            .iter()
            .map(|s| format!("{prefix}{SERVER}/{}", s.name))
            .collect()
    };
    json!({
        "name": AGENT,
        "description": "Creates and runs HyperPod GPU clusters, training jobs and model endpoints through hypd: inspects first, plans every change, asks before each one, follows operations to their end.",
        "prompt": PROMPT,
        "mcpServers": {
            SERVER: { "command": command, "args": args, "timeout": 360_000 },
        },
        "tools": [format!("@{SERVER}")],
        "allowedTools": names(&read, "@"),
        "permissions": {
            "rules": [
                { "capability": "mcp", "match": names(&read, ""), "effect": "allow" },
                { "capability": "mcp", "match": names(&gated, ""), "effect": "ask" },
            ],
        },
        "resources": resources,
        "includeMcpJson": false,
    })
}

/// The generic MCP client configuration (`.mcp.json`): the bridge over stdio, reading
/// `HYPD_URL` and `HYPD_TOKEN` from the environment it inherits.
pub fn mcp_json() -> Value {
    json!({
        "mcpServers": {
            SERVER: { "type": "stdio", "command": "hypd", "args": ["mcp"] },
        },
    })
}

/// The Claude Code subagent (`.claude/agents/hypd-inst-agent.md`): every hypd tool, the
/// read-only ones listed first; approval is the client's own per-tool prompt.
pub fn claude() -> String {
    let (read, gated) = split();
    let tools: Vec<String> = read
        .iter()
        .chain(gated.iter())
        .map(|s| format!("mcp__{SERVER}__{}", s.name))
        .collect();
    format!(
        "---\nname: {AGENT}\ndescription: Creates and runs HyperPod GPU clusters, training jobs and model endpoints through hypd. Use for any cluster, job or endpoint work on AWS.\ntools: {}\n---\n\n{PROMPT}\n\nPlaybooks: hypd's playbooks/ directory, one per job.\n",
        tools.join(", ")
    )
}

/// The committed files, each with its generated content (relative to the repository).
pub fn committed() -> Vec<(&'static str, String)> {
    let pretty = |v: &Value| format!("{}\n", serde_json::to_string_pretty(v).unwrap_or_default());
    vec![
        (
            "playbooks/hypd-inst-agent.json",
            pretty(&kiro(
                "hypd",
                &["mcp".to_owned()],
                &["file://playbooks/*.md".to_owned()],
            )),
        ),
        ("playbooks/clients/mcp.json", pretty(&mcp_json())),
        ("playbooks/clients/claude/hypd-inst-agent.md", claude()),
    ]
}

/// Where Kiro CLI reads global agents: `$KIRO_AGENT_CONFIG_DIR`, else `~/.kiro/agents`.
pub fn kiro_dir(env: &dyn Fn(&str) -> Option<String>) -> Option<PathBuf> {
    env("KIRO_AGENT_CONFIG_DIR")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .or_else(|| env("HOME").map(|h| Path::new(&h).join(".kiro").join("agents")))
}

/// Writes the playbooks to `playbooks` and the agent, starting the bridge with `hypd`
/// (this binary's path, so Kiro finds it off the PATH too) and pointing at `url` (and at
/// the token in `token_file`, if given), to `agents/hypd-inst-agent.json`; the agent's
/// path. The playbooks stay out of Kiro's agents directory, whose markdown files its V3
/// engine would read as agents.
pub fn install(
    hypd: &Path,
    agents: &Path,
    playbooks: &Path,
    url: &str,
    token_file: Option<&Path>,
) -> std::io::Result<PathBuf> {
    std::fs::create_dir_all(playbooks)?;
    for (name, text) in PLAYBOOKS {
        std::fs::write(playbooks.join(name), text)?;
    }
    let mut args = vec!["mcp".to_owned(), "--url".to_owned(), url.to_owned()];
    if let Some(file) = token_file {
        args.extend(["--token-file".to_owned(), file.display().to_string()]);
    }
    let resources = vec![format!("file://{}/*.md", playbooks.display())];
    std::fs::create_dir_all(agents)?;
    let path = agents.join(format!("{AGENT}.json"));
    let text = serde_json::to_string_pretty(&kiro(&hypd.display().to_string(), &args, &resources))
        .map_err(std::io::Error::other)?;
    std::fs::write(&path, format!("{text}\n"))?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
    }

    #[test]
    fn the_committed_agent_files_are_what_the_registry_generates() {
        for (path, generated) in committed() {
            let on_disk = std::fs::read_to_string(root().join(path)).unwrap_or_default();
            if std::env::var_os("HYPD_REGENERATE").is_some() {
                std::fs::create_dir_all(root().join(path).parent().unwrap()).unwrap();
                std::fs::write(root().join(path), &generated).unwrap();
                continue;
            }
            assert_eq!(
                on_disk, generated,
                "{path} differs from what the registry generates: run HYPD_REGENERATE=1 cargo test -p server --lib agent::"
            );
        }
    }

    #[test]
    fn read_only_tools_run_unasked_and_every_other_tool_asks() {
        let agent = kiro("hypd", &["mcp".into()], &[]);
        let rules = agent["permissions"]["rules"].as_array().unwrap();
        let of = |effect: &str| -> Vec<String> {
            rules
                .iter()
                .filter(|r| r["effect"] == effect)
                .flat_map(|r| r["match"].as_array().unwrap().clone())
                .map(|m| m.as_str().unwrap().to_owned())
                .collect()
        };
        let (allow, ask) = (of("allow"), of("ask"));
        assert!(
            allow.contains(&"hypd/list_clusters".to_owned()),
            "{allow:?}"
        );
        assert!(
            allow.contains(&"hypd/wait_operation".to_owned()),
            "{allow:?}"
        );
        for gated in [
            "hypd/create_cluster",
            "hypd/delete_cluster",
            "hypd/deploy_model_server",
        ] {
            assert!(ask.contains(&gated.to_owned()) && !allow.contains(&gated.to_owned()));
        }
        assert_eq!(
            allow.len() + ask.len(),
            COMMANDS.len(),
            "every tool has one rule"
        );
        let v2: Vec<&str> = agent["allowedTools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_str().unwrap().trim_start_matches('@'))
            .collect();
        assert_eq!(v2, allow, "both engines allow the same tools");
    }

    /// A call written in a playbook: `tool(argument, argument=value)`.
    struct Call {
        tool: String,
        args: Vec<(String, Option<String>)>,
    }

    /// The calls of one step (a numbered item, or the prose before the first).
    fn calls(step: &str) -> Vec<Call> {
        let text = step.split_whitespace().collect::<Vec<_>>().join(" ");
        text.split('`')
            .skip(1)
            .step_by(2)
            .filter_map(|span| {
                let (tool, rest) = span.split_once('(')?;
                let inside = rest.strip_suffix(')')?;
                let plain = |c: char| c.is_ascii_lowercase() || c == '_';
                (!tool.is_empty() && tool.chars().all(plain)).then(|| Call {
                    tool: tool.to_owned(),
                    args: inside
                        .split(',')
                        .map(str::trim)
                        .filter(|a| !a.is_empty())
                        .map(|a| match a.split_once('=') {
                            Some((k, v)) => (k.trim().to_owned(), Some(v.trim().to_owned())),
                            None => (a.to_owned(), None),
                        })
                        .collect(),
                })
            })
            .collect()
    }

    fn steps(body: &str) -> Vec<String> {
        let mut steps = vec![String::new()];
        for line in body.lines() {
            let numbered = line
                .split_once(". ")
                .is_some_and(|(n, _)| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()));
            if numbered {
                steps.push(String::new());
            }
            let step = steps.last_mut().expect("one");
            step.push_str(line);
            step.push('\n');
        }
        steps
    }

    /// One call of a playbook's declared `flow`: a tool, as a plan (`tool(dry_run)`; a
    /// destructive tool's bare first call), as an apply (a mutation's bare call, a
    /// destructive one's `tool(confirmation)` or its bare call after a dry run) or as a
    /// read.
    struct Step {
        tool: String,
        marker: Option<String>,
    }

    /// A workflow playbook's `flow: a, b > c(dry_run) > c > wait_operation`: phases in
    /// the order they must run, the calls of one phase in any order.
    fn flow(line: &str) -> Vec<Vec<Step>> {
        line.split('>')
            .map(|phase| {
                phase
                    .split(',')
                    .map(str::trim)
                    .filter(|c| !c.is_empty())
                    .map(|c| match c.split_once('(') {
                        Some((tool, rest)) => Step {
                            tool: tool.trim().to_owned(),
                            marker: Some(rest.trim_end_matches(')').trim().to_owned()),
                        },
                        None => Step {
                            tool: c.to_owned(),
                            marker: None,
                        },
                    })
                    .collect()
            })
            .collect()
    }

    /// What a declared flow breaks of the order every workflow keeps: inspect before any
    /// change, the plan of a change before it is applied, every applied change followed
    /// by the tool that decides it before the next change and before the end; and every
    /// tool it names is one the steps call.
    fn flow_problems(file: &str, line: &str, body_tools: &[String]) -> Vec<String> {
        let mut found = Vec::new();
        let phases = flow(line);
        let mut read = false;
        let mut planned: Vec<&str> = Vec::new();
        let mut open: Option<(&str, &str)> = None;
        for (n, phase) in phases.iter().enumerate() {
            let mut follows = false;
            for step in phase {
                let Some(spec) = COMMANDS
                    .iter()
                    .map(|c| &c.spec)
                    .find(|s| s.name == step.tool)
                else {
                    found.push(format!("{file} flow phase {n}: no tool {}", step.tool));
                    continue;
                };
                if !body_tools.contains(&step.tool) {
                    found.push(format!(
                        "{file} flow phase {n}: {} is in the flow but no step calls it",
                        step.tool
                    ));
                }
                let marker = step.marker.as_deref();
                let (plan, apply) = match (spec.effect, marker) {
                    (Effect::ReadOnly, None) => (false, false),
                    (Effect::Mutating, Some("dry_run")) => (true, false),
                    (Effect::Mutating, None) => (false, true),
                    (Effect::Destructive, Some("dry_run")) => (true, false),
                    // A destructive tool's bare call is its plan, unless it was planned
                    // with dry_run: then it applies (its gate asks for a confirmation
                    // only when the change destroys something).
                    (Effect::Destructive, None) => {
                        let applies = planned.contains(&step.tool.as_str());
                        (!applies, applies)
                    }
                    (Effect::Destructive, Some("confirmation")) => (false, true),
                    (_, Some(m)) => {
                        found.push(format!(
                            "{file} flow phase {n}: {}({m}) is not a plan or an apply of it",
                            step.tool
                        ));
                        continue;
                    }
                };
                let status = spec.status_command.unwrap_or("wait_operation");
                if let Some((_, waits)) = open
                    && (step.tool == waits || step.tool == "wait_operation")
                {
                    follows = true;
                }
                if spec.effect == Effect::ReadOnly {
                    read = true;
                    continue;
                }
                if !read {
                    found.push(format!(
                        "{file} flow phase {n}: {} before anything is inspected",
                        step.tool
                    ));
                }
                if let Some((tool, _)) = open {
                    found.push(format!(
                        "{file} flow phase {n}: {} before {tool} is followed to its end",
                        step.tool
                    ));
                }
                if plan {
                    planned.push(&step.tool);
                }
                if apply {
                    if !planned.contains(&step.tool.as_str()) {
                        found.push(format!(
                            "{file} flow phase {n}: {} applied before its plan",
                            step.tool
                        ));
                    }
                    open = Some((&step.tool, status));
                }
            }
            if follows {
                open = None;
            }
        }
        if let Some((tool, _)) = open {
            found.push(format!("{file} flow: {tool} is never followed to its end"));
        }
        found
    }

    fn arguments(spec: &CommandSpec) -> Vec<String> {
        let entry = COMMANDS
            .iter()
            .find(|c| c.spec.name == spec.name)
            .expect("listed");
        // The arguments MCP publishes for the tool.
        let schema = crate::faces::mcp::compact_schema(entry.request_schema);
        schema
            .get("properties")
            .and_then(Value::as_object)
            .map(|p| p.keys().cloned().collect())
            .unwrap_or_default()
    }

    /// What a playbook may say: tools and arguments the registry has, a version with its
    /// changelog entry, and every change it applies followed by the tool that decides it.
    fn problems(file: &str, text: &str) -> Vec<String> {
        let mut found = Vec::new();
        let Some(playbook) = Playbook::parse(file, text) else {
            return vec![format!("{file}: no front matter")];
        };
        let body = playbook.body;
        if playbook.playbook != Some(playbook.name) {
            found.push(format!(
                "{file}: front matter's playbook is not the file's name"
            ));
        }
        if !matches!(playbook.kind, Some("workflow" | "diagnostic")) {
            found.push(format!("{file}: kind is workflow or diagnostic"));
        }
        // MCP describes the playbook's prompt with them.
        if playbook.title.is_none() || playbook.intro.is_none() {
            found.push(format!(
                "{file}: an H1 title, then a paragraph saying what it does"
            ));
        }
        match playbook.version {
            Some(v) if v.split('.').count() == 3 => {
                if !body.contains(&format!("\n- {v} (")) {
                    found.push(format!("{file}: no changelog entry for version {v}"));
                }
            }
            _ => found.push(format!("{file}: no major.minor.patch version")),
        }
        let body_tools: Vec<String> = steps(body)
            .iter()
            .flat_map(|s| calls(s))
            .map(|c| c.tool)
            .collect();
        match (playbook.kind, playbook.flow) {
            (Some("workflow"), Some(line)) => found.extend(flow_problems(file, line, &body_tools)),
            (Some("workflow"), None) => found.push(format!("{file}: a workflow declares its flow")),
            _ => {}
        }
        for (n, step) in steps(body).iter().enumerate() {
            for call in calls(step) {
                let Some(spec) = COMMANDS
                    .iter()
                    .map(|c| &c.spec)
                    .find(|s| s.name == call.tool)
                else {
                    found.push(format!("{file} step {n}: no tool {}", call.tool));
                    continue;
                };
                let known = arguments(spec);
                for (arg, _) in &call.args {
                    if !known.contains(arg) {
                        found.push(format!("{file} step {n}: {} takes no {arg}", call.tool));
                    }
                }
                let has = |k: &str, v: Option<&str>| {
                    call.args
                        .iter()
                        .any(|(a, x)| a == k && (v.is_none() || x.as_deref() == v))
                };
                let applies = match spec.effect {
                    Effect::ReadOnly => false,
                    Effect::Mutating => !has("dry_run", Some("true")),
                    Effect::Destructive => has("confirmation", None),
                };
                let status = spec.status_command.unwrap_or("wait_operation");
                let followed = calls(step)
                    .iter()
                    .any(|c| c.tool == "wait_operation" || c.tool == status);
                if applies && !followed {
                    found.push(format!(
                        "{file} step {n}: {} changes things but the step does not follow it with wait_operation",
                        call.tool
                    ));
                }
            }
        }
        found
    }

    #[test]
    fn every_playbook_names_only_tools_and_arguments_hypd_has() {
        let on_disk: Vec<String> = std::fs::read_dir(root().join("playbooks"))
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|n| n.ends_with(".md") && n != "README.md")
            .collect();
        let compiled: Vec<&str> = PLAYBOOKS.iter().map(|(n, _)| *n).collect();
        let mut sorted = on_disk.clone();
        sorted.sort();
        assert_eq!(
            sorted, compiled,
            "every playbook is compiled into hypd (agent::PLAYBOOKS)"
        );
        let found: Vec<String> = PLAYBOOKS
            .iter()
            .flat_map(|(file, text)| problems(file, text))
            .collect();
        assert!(found.is_empty(), "{found:#?}");
    }

    #[test]
    fn the_drift_check_catches_what_a_careless_edit_would_write() {
        let (file, good) = *PLAYBOOKS
            .iter()
            .find(|(f, _)| *f == "create-cluster.md")
            .expect("listed");
        let broken = [
            good.replace("`list_regions()`", "`list_regionz()`"),
            good.replace("`whoami()`", "`whoami(verbose=true)`"),
            good.replace(", then `wait_operation(operation_id)`", ""),
            good.replace("version: 1.2.0", "version: 1.3.0"),
            // The flow may not skip the plan, the follow-up, or the inspection.
            good.replace(" > create_cluster(dry_run)", ""),
            good.replace(" > wait_operation", ""),
            good.replace(
                "whoami, list_clusters, list_regions > list_availability_zones, list_instance_types, list_capacity > ",
                "",
            ),
            good.replace("flow: ", "flaw: "),
            // MCP's prompt description is made of the title and the paragraph under it.
            good.replace("# Create a GPU cluster", "Create a GPU cluster"),
        ];
        for text in &broken {
            assert!(!problems(file, text).is_empty(), "{text}");
        }
        assert!(problems(file, good).is_empty());
    }

    #[test]
    fn a_playbook_is_read_from_its_front_matter_and_its_opening() {
        let all: Vec<Playbook> = playbooks().collect();
        assert_eq!(all.len(), PLAYBOOKS.len(), "every playbook parses");
        let create = all
            .iter()
            .find(|p| p.file == "create-cluster.md")
            .expect("listed");
        assert_eq!(create.name, "create-cluster");
        assert_eq!(create.playbook, Some("create-cluster"));
        assert_eq!(create.version, Some("1.2.0"));
        assert_eq!(create.kind, Some("workflow"));
        assert_eq!(create.arguments, ["region", "availability_zone"]);
        assert!(create.flow.is_some_and(|f| f.starts_with("whoami, ")));
        assert_eq!(create.title, Some("Create a GPU cluster"));
        let intro = create.intro.as_deref().unwrap_or_default();
        assert!(
            intro.starts_with("Makes a HyperPod-on-EKS cluster from the user's decisions only:")
                && intro.ends_with("is hypd's to choose."),
            "{intro}"
        );
        assert!(!intro.contains('\n'), "{intro}");
        assert!(create.body.starts_with("\n# Create a GPU cluster"));
        assert_eq!(Playbook::parse("x.md", "# No front matter\n"), None);
        let bare = Playbook::parse("x.md", "---\nkind: diagnostic\n---\nNo title.\n").unwrap();
        assert_eq!(
            (bare.title, bare.intro, bare.arguments.len()),
            (None, None, 0)
        );
    }

    #[test]
    fn install_writes_the_agent_and_its_playbooks_and_no_token() {
        let dir = std::env::temp_dir().join(format!("hypd-agent-{}", std::process::id()));
        let token = dir.join("token");
        let path = install(
            Path::new("/usr/local/bin/hypd"),
            &dir.join("agents"),
            &dir.join("playbooks"),
            "http://127.0.0.1:3099",
            Some(&token),
        )
        .unwrap();
        let agent: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(
            agent["mcpServers"][SERVER]["command"],
            "/usr/local/bin/hypd"
        );
        let args = &agent["mcpServers"][SERVER]["args"];
        assert_eq!(args[0], "mcp");
        assert_eq!(args[2], "http://127.0.0.1:3099");
        assert_eq!(args[4], token.display().to_string());
        let resources = agent["resources"][0].as_str().unwrap();
        assert!(resources.starts_with("file://") && resources.ends_with("/playbooks/*.md"));
        for (name, _) in PLAYBOOKS {
            assert!(dir.join("playbooks").join(name).exists(), "{name}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
