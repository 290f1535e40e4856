//! The `hypd` command line. Every failure before the server is up is one line on stderr
//! and exit code 2, so scripts and container supervisors can tell misconfiguration from
//! a crash.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

use crate::config::{self, ConfigError, Database, LogConfig, LogFormat, Resolver, ServeConfig};
use crate::faces::http;
use crate::{sandbox, telemetry};

#[derive(Parser, Debug)]
#[command(
    name = "hypd",
    version,
    about = "Control plane for GPU training and inference clusters on AWS (EKS + SageMaker HyperPod)",
    long_about = None,
    propagate_version = true
)]
pub struct Cli {
    /// Log format: human or json  [env: HYPD_LOG_FORMAT] [default: human]
    #[arg(long, global = true, value_name = "FORMAT")]
    log_format: Option<String>,

    /// Log filter, e.g. info or hypd=debug,tower_http=info  [env: HYPD_LOG] [default: info]
    #[arg(long, global = true, value_name = "FILTER")]
    log: Option<String>,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Serve the web console, REST API (/api/v1), MCP (/mcp) and live updates on one port
    Serve(Box<ServeArgs>),
    /// MCP over stdio for agents: relays to a running hypd's /mcp, so there is one engine
    /// and one store
    Mcp(McpArgs),
    /// Exit 0 when a hypd on this machine answers /healthz (for container health checks)
    Health(HealthArgs),
    /// The hypd-inst-agent for Kiro CLI
    #[command(subcommand)]
    Agent(AgentCommand),
}

#[derive(Subcommand, Debug)]
enum AgentCommand {
    /// Write hypd-inst-agent where Kiro CLI looks for agents, pointing at this server,
    /// and its playbooks to hypd's data directory
    Install(InstallArgs),
}

#[derive(Args, Debug)]
struct InstallArgs {
    /// Base URL of the hypd the agent talks to  [env: HYPD_URL] [default: http://127.0.0.1:3099]
    #[arg(long, value_name = "URL")]
    url: Option<String>,

    /// File holding the agent's API token (an operator token); the agent names the file,
    /// never the token  [default: the bridge reads HYPD_TOKEN from Kiro's environment]
    #[arg(long, value_name = "PATH")]
    token_file: Option<String>,

    /// Where to write the agent  [env: KIRO_AGENT_CONFIG_DIR] [default: ~/.kiro/agents]
    #[arg(long, value_name = "DIR")]
    dir: Option<String>,

    /// hypd's data directory, whose playbooks/ the agent loads
    /// [env: HYPD_DATA_DIR] [default: $XDG_DATA_HOME/hypd or ~/.local/share/hypd]
    #[arg(long, value_name = "DIR")]
    data_dir: Option<String>,
}

impl InstallArgs {
    fn run(
        &self,
        r: &Resolver<'_>,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<String, String> {
        let url = server_url(r, self.url.as_deref())?;
        // A token file that cannot be read would only fail later, inside Kiro.
        let token_file = match &self.token_file {
            Some(path) => {
                let path = std::path::absolute(path).map_err(|e| format!("{path}: {e}"))?;
                read_token(&path)?;
                Some(path)
            }
            None => None,
        };
        let agents = match &self.dir {
            Some(dir) => PathBuf::from(dir),
            None => crate::agent::kiro_dir(env).ok_or(
                "no Kiro agents directory: set HOME or KIRO_AGENT_CONFIG_DIR, or pass --dir",
            )?,
        };
        let data_dir = data_dir(r, self.data_dir.as_deref(), env).map_err(|e| e.to_string())?;
        let hypd = std::env::current_exe()
            .map_err(|e| format!("cannot tell where this hypd binary is: {e}"))?;
        let path = crate::agent::install(
            &hypd,
            &agents,
            &data_dir.join("playbooks"),
            &url,
            token_file.as_deref(),
        )
        .map_err(|e| format!("cannot write the agent to {}: {e}", agents.display()))?;
        Ok(format!(
            "wrote {} (tools of {url}); start it with: kiro-cli chat --agent {}",
            path.display(),
            crate::agent::AGENT
        ))
    }
}

#[derive(Args, Debug)]
struct HealthArgs {
    /// Base URL to check  [env: HYPD_URL] [default: http://127.0.0.1:$HYPD_PORT]
    #[arg(long, value_name = "URL")]
    url: Option<String>,
}

#[derive(Args, Debug)]
struct McpArgs {
    /// Base URL of the running hypd  [env: HYPD_URL] [default: http://127.0.0.1:3099]
    #[arg(long, value_name = "URL")]
    url: Option<String>,

    /// File holding the API token to use (prefer a viewer or operator token for agents)
    /// [env: HYPD_TOKEN holds the token itself]
    /// [default: <data dir>/admin-token, else <data dir>/sandbox/admin-token]
    #[arg(long, value_name = "PATH")]
    token_file: Option<String>,

    /// Data directory whose admin-token is used when no token is given
    /// [env: HYPD_DATA_DIR] [default: $XDG_DATA_HOME/hypd or ~/.local/share/hypd]
    #[arg(long, value_name = "DIR")]
    data_dir: Option<String>,
}

impl McpArgs {
    fn resolve(
        &self,
        r: &Resolver<'_>,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<(String, String), String> {
        let url = server_url(r, self.url.as_deref())?;
        if let Some(path) = &self.token_file {
            return read_token(std::path::Path::new(path)).map(|t| (url, t));
        }
        if let Some(token) = env(config::TOKEN.env).filter(|t| !t.trim().is_empty()) {
            return Ok((url, token.trim().to_owned()));
        }
        let data_dir = data_dir(r, self.data_dir.as_deref(), env).map_err(|e| e.to_string())?;
        // A real store's token first, else the sandbox's.
        let real = data_dir.join(crate::auth::ADMIN_TOKEN_FILE);
        let sandbox =
            crate::sandbox::state_dir(&data_dir, true).join(crate::auth::ADMIN_TOKEN_FILE);
        let file = if real.exists() || !sandbox.exists() {
            real
        } else {
            sandbox
        };
        read_token(&file).map(|t| (url, t))
    }
}

/// hypd's data directory: `--data-dir`, else `HYPD_DATA_DIR`, else the platform's.
fn data_dir(
    r: &Resolver<'_>,
    flag: Option<&str>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<PathBuf, ConfigError> {
    Ok(r.get(&config::DATA_DIR, flag, config::parse_path)?
        .unwrap_or_else(|| config::default_data_dir(env)))
}

/// The running hypd a client command talks to: `--url`, else `HYPD_URL`, else this
/// machine's default port.
fn server_url(r: &Resolver<'_>, flag: Option<&str>) -> Result<String, String> {
    Ok(r.get(&config::URL, flag, config::parse_url)
        .map_err(|e| e.to_string())?
        .unwrap_or_else(|| format!("http://127.0.0.1:{}", config::DEFAULT_PORT)))
}

fn read_token(path: &std::path::Path) -> Result<String, String> {
    match std::fs::read_to_string(path) {
        Ok(t) if !t.trim().is_empty() => Ok(t.trim().to_owned()),
        Ok(_) => Err(format!("the token file {} is empty", path.display())),
        Err(e) => Err(format!(
            "no token: set HYPD_TOKEN or --token-file (cannot read {}: {e})",
            path.display()
        )),
    }
}

#[derive(Args, Debug)]
struct ServeArgs {
    /// TCP port to listen on; 0 picks a free one  [env: HYPD_PORT] [default: 3099]
    #[arg(long, value_name = "PORT")]
    port: Option<String>,

    /// Address to listen on; 0.0.0.0 inside a container  [env: HYPD_BIND] [default: 127.0.0.1]
    #[arg(long, value_name = "ADDR")]
    bind: Option<String>,

    /// Directory for the SQLite store, the admin token and sandbox logs
    /// [env: HYPD_DATA_DIR] [default: $XDG_DATA_HOME/hypd or ~/.local/share/hypd]
    #[arg(long, value_name = "DIR")]
    data_dir: Option<String>,

    /// PostgreSQL URL for a store shared by several replicas (prefer the variable: flags
    /// show in `ps`)  [env: HYPD_DATABASE_URL] [default: SQLite in the data dir]
    #[arg(long, value_name = "URL")]
    database_url: Option<String>,

    /// Directory with the built console (pkg/hypd.js, pkg/hypd.wasm, pkg/hypd.css)
    /// [env: HYPD_SITE_ROOT] [default: site/ beside the binary, else target/site]
    #[arg(long, value_name = "DIR")]
    site_root: Option<String>,

    /// Run against a local test world (moto + hypd-sim) instead of AWS: no account needed,
    /// nothing is created in AWS  [env: HYPD_SANDBOX]
    #[arg(long)]
    sandbox: bool,

    /// Host names (or IPs) the console and API answer to besides localhost, 127.0.0.1 and
    /// [::1], comma-separated; * for any  [env: HYPD_ALLOWED_HOSTS] [default: loopback
    /// names only on a loopback bind, any host otherwise]
    #[arg(long, value_name = "HOSTS")]
    allowed_hosts: Option<String>,

    /// Requests per second each token or session may send (bursts of 5 seconds' worth);
    /// 0 for no limit  [env: HYPD_RATE_LIMIT] [default: 20]
    #[arg(long, value_name = "N")]
    rate_limit: Option<String>,

    /// Seconds a connection may stay open with no request in flight; keep it above a load
    /// balancer's own idle timeout  [env: HYPD_IDLE_TIMEOUT] [default: 60]
    #[arg(long, value_name = "SECONDS")]
    idle_timeout: Option<String>,

    /// Connections served at once; more are answered 503  [env: HYPD_MAX_CONNECTIONS]
    /// [default: 1024, less if the open-file limit is lower]
    #[arg(long, value_name = "N")]
    max_connections: Option<String>,

    /// Days the audit log is kept; 0 keeps it for ever  [env: HYPD_AUDIT_RETENTION_DAYS]
    /// [default: 365]
    #[arg(long, value_name = "DAYS")]
    audit_retention_days: Option<String>,

    /// Days the events of finished operations are kept; 0 keeps them for ever
    /// [env: HYPD_EVENT_RETENTION_DAYS] [default: 90]
    #[arg(long, value_name = "DAYS")]
    event_retention_days: Option<String>,

    /// Shortest wait before a waiting operation stage looks at AWS again, and the age of
    /// a node list's HyperPod read that is answered without reading again (10ms to 60s)
    /// [env: HYPD_MIN_POLL_INTERVAL] [default: 1s]
    #[arg(long, value_name = "DURATION")]
    min_poll_interval: Option<String>,

    /// Wait after a stage's first transient failure, doubled for each further one up to a
    /// minute (10ms to 60s)  [env: HYPD_RETRY_BACKOFF] [default: 2s]
    #[arg(long, value_name = "DURATION")]
    retry_backoff: Option<String>,

    /// Read regions, zones and instance types from AWS at start, so the create form's
    /// first open does not wait for them; false reads them when first asked (true or
    /// false)  [env: HYPD_WARM_CATALOGUE] [default: true]
    #[arg(long, value_name = "BOOL")]
    warm_catalogue: Option<String>,
}

impl ServeArgs {
    fn resolve(
        &self,
        r: &Resolver<'_>,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<ServeConfig, ConfigError> {
        let port = r
            .get(&config::PORT, self.port.as_deref(), config::parse_port)?
            .unwrap_or(config::DEFAULT_PORT);
        let bind = r
            .get(&config::BIND, self.bind.as_deref(), config::parse_ip)?
            .unwrap_or(config::DEFAULT_BIND);
        let data_dir = data_dir(r, self.data_dir.as_deref(), env)?;
        // The flag is a switch; the variable can turn it on as well.
        let sandbox = self.sandbox
            || r.get(&config::SANDBOX, None, config::parse_bool)?
                .unwrap_or(false);
        let database = r
            .get(
                &config::DATABASE_URL,
                self.database_url.as_deref(),
                config::parse_database_url,
            )?
            .unwrap_or_else(|| Database::Sqlite(sandbox::store_file(&data_dir, sandbox)));
        let site_root = r
            .get(
                &config::SITE_ROOT,
                self.site_root.as_deref(),
                config::parse_path,
            )?
            .unwrap_or_else(default_site_root);
        let configured_hosts = r.get(
            &config::ALLOWED_HOSTS,
            self.allowed_hosts.as_deref(),
            config::parse_allowed_hosts,
        )?;
        let allowed_hosts = crate::faces::limits::allowed_hosts(bind, configured_hosts);
        let defaults = crate::config::Limits::default();
        let limits = crate::config::Limits {
            rate_per_second: r
                .get(
                    &config::RATE_LIMIT,
                    self.rate_limit.as_deref(),
                    config::parse_rate_limit,
                )?
                .unwrap_or(defaults.rate_per_second),
            idle_timeout: r
                .get(
                    &config::IDLE_TIMEOUT,
                    self.idle_timeout.as_deref(),
                    config::parse_idle_timeout,
                )?
                .map_or(defaults.idle_timeout, std::time::Duration::from_secs),
            max_connections: r
                .get(
                    &config::MAX_CONNECTIONS,
                    self.max_connections.as_deref(),
                    config::parse_max_connections,
                )?
                .unwrap_or(defaults.max_connections),
            ..defaults
        };
        let days = |setting, flag: &Option<String>, default| {
            r.get(setting, flag.as_deref(), config::parse_retention_days)
                .map(|d| d.unwrap_or(default))
        };
        let retention = crate::retention::Retention {
            audit_days: days(
                &config::AUDIT_RETENTION,
                &self.audit_retention_days,
                crate::retention::Retention::DEFAULT.audit_days,
            )?,
            event_days: days(
                &config::EVENT_RETENTION,
                &self.event_retention_days,
                crate::retention::Retention::DEFAULT.event_days,
            )?,
        };
        let paced = |setting, flag: &Option<String>, default| {
            r.get(setting, flag.as_deref(), config::parse_pace)
                .map(|d| d.unwrap_or(default))
        };
        let default_pace = crate::operation::worker::Pace::DEFAULT;
        let pace = crate::operation::worker::Pace {
            min_poll: paced(
                &config::MIN_POLL_INTERVAL,
                &self.min_poll_interval,
                default_pace.min_poll,
            )?,
            retry_backoff: paced(
                &config::RETRY_BACKOFF,
                &self.retry_backoff,
                default_pace.retry_backoff,
            )?,
        };
        let warm_catalogue = r
            .get(
                &config::WARM_CATALOGUE,
                self.warm_catalogue.as_deref(),
                config::parse_bool,
            )?
            .unwrap_or(true);
        Ok(ServeConfig {
            bind,
            port,
            data_dir,
            database,
            site_root,
            sandbox,
            allowed_hosts,
            limits,
            retention,
            pace,
            warm_catalogue,
        })
    }
}

/// `site/` beside the binary (release archives and the container), else the workspace's
/// `target/site` where console-build writes it.
fn default_site_root() -> PathBuf {
    let beside = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|d| d.join("site")));
    match beside {
        Some(dir) if dir.join("pkg").is_dir() => dir,
        _ => PathBuf::from("target/site"),
    }
}

fn resolve_log(cli: &Cli, r: &Resolver<'_>) -> Result<LogConfig, ConfigError> {
    let format = r
        .get(
            &config::LOG_FORMAT,
            cli.log_format.as_deref(),
            config::parse_log_format,
        )?
        .unwrap_or(LogFormat::Human);
    let filter = r
        .get(&config::LOG, cli.log.as_deref(), config::parse_log_filter)?
        .unwrap_or_else(|| "info".to_owned());
    Ok(LogConfig { format, filter })
}

const EXIT_USAGE: u8 = 2;

fn usage_error(message: impl std::fmt::Display) -> ExitCode {
    eprintln!("hypd: {message}");
    ExitCode::from(EXIT_USAGE)
}

pub fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion)
                || e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
            {
                let _ = e.print();
                return if e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
                    ExitCode::from(EXIT_USAGE)
                } else {
                    ExitCode::SUCCESS
                };
            }
            // clap's first line names the flag and the problem; the rest is a usage dump.
            let rendered = e.render().to_string();
            let first = rendered.lines().next().unwrap_or("invalid arguments");
            let first = first.strip_prefix("error: ").unwrap_or(first);
            return usage_error(format_args!("{first} (see hypd --help)"));
        }
    };

    let env = |k: &str| std::env::var(k).ok();
    let resolver = Resolver::new(&env);
    let log = match resolve_log(&cli, &resolver) {
        Ok(l) => l,
        Err(e) => return usage_error(e),
    };

    match &cli.command {
        Command::Serve(args) => {
            let cfg = match args.resolve(&resolver, &env) {
                Ok(c) => c,
                Err(e) => return usage_error(e),
            };
            telemetry::init_logging(&log);
            for var in Resolver::unknown_variables(std::env::vars().map(|(k, _)| k)) {
                tracing::warn!(variable = %var, "ignoring unknown HYPD_* variable (a typo?)");
            }
            run_serve(cfg)
        }
        Command::Health(args) => {
            let url = match resolver.get(&config::URL, args.url.as_deref(), config::parse_url) {
                Ok(Some(u)) => u,
                Ok(None) => match resolver.get(&config::PORT, None, config::parse_port) {
                    Ok(port) => {
                        format!("http://127.0.0.1:{}", port.unwrap_or(config::DEFAULT_PORT))
                    }
                    Err(e) => return usage_error(e),
                },
                Err(e) => return usage_error(e),
            };
            check_health(&url)
        }
        Command::Mcp(args) => {
            let (url, token) = match args.resolve(&resolver, &env) {
                Ok(v) => v,
                Err(e) => return usage_error(e),
            };
            // stdout carries the protocol: logs go to stderr only, and quietly.
            telemetry::init_logging(&LogConfig {
                filter: "warn".into(),
                ..log
            });
            run_bridge(&url, token)
        }
        Command::Agent(AgentCommand::Install(args)) => match args.run(&resolver, &env) {
            Ok(done) => {
                println!("{done}");
                ExitCode::SUCCESS
            }
            Err(e) => usage_error(e),
        },
    }
}

/// The async runtime every subcommand runs on; failing to start it is reported once.
fn runtime() -> Result<tokio::runtime::Runtime, ExitCode> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| {
            eprintln!("hypd: cannot start the async runtime: {e}");
            ExitCode::FAILURE
        })
}

fn check_health(url: &str) -> ExitCode {
    let runtime = match runtime() {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    let result = runtime.block_on(async {
        reqwest::Client::new()
            .get(format!("{url}/healthz"))
            .timeout(std::time::Duration::from_secs(3))
            .send()
            .await
    });
    match result {
        Ok(r) if r.status().is_success() => ExitCode::SUCCESS,
        Ok(r) => {
            eprintln!("hypd health: {url}/healthz answered {}", r.status());
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("hypd health: {url}/healthz: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run_bridge(url: &str, token: String) -> ExitCode {
    let runtime = match runtime() {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    let result = runtime.block_on(async {
        let bridge = std::sync::Arc::new(crate::faces::bridge::Bridge::new(url, token)?);
        bridge.run().await
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("hypd mcp: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run_serve(cfg: ServeConfig) -> ExitCode {
    // The sandbox starts before the runtime: it sets the standard AWS_* variables for this
    // process, which is only sound while no other thread can read the environment.
    let sandbox = if cfg.sandbox {
        match sandbox::Sandbox::start(&cfg.data_dir) {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::error!(error = %e, "could not start the sandbox");
                eprintln!("hypd: could not start the sandbox: {e}");
                return ExitCode::FAILURE;
            }
        }
    } else {
        None
    };

    let runtime = match runtime() {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    let result = runtime.block_on(http::serve(cfg, sandbox.as_ref().map(|s| s.info())));
    drop(sandbox);
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "hypd stopped");
            eprintln!("hypd: {e}");
            ExitCode::FAILURE
        }
    }
}
