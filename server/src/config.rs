//! Settings from flags and `HYPD_*` variables. A flag wins over its variable, the variable
//! over the default; a bad value stops start-up with one line naming where it came from
//! and the rule it broke, never a backtrace and never the value of a secret.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

pub const DEFAULT_PORT: u16 = 3099;

/// Where a setting's value came from: named in errors so the user knows what to fix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Origin {
    Flag(&'static str),
    Env(&'static str),
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Origin::Flag(name) => write!(f, "--{name}"),
            Origin::Env(name) => f.write_str(name),
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    #[error("invalid value {shown} for {origin}: {rule}")]
    Invalid {
        origin: Origin,
        /// The value quoted, or a placeholder for settings that may carry secrets.
        shown: String,
        rule: &'static str,
    },
}

/// One setting: its flag, its variable, and whether its value may be shown in errors.
pub struct Setting {
    pub flag: &'static str,
    pub env: &'static str,
    pub secret: bool,
}

pub const PORT: Setting = Setting {
    flag: "port",
    env: "HYPD_PORT",
    secret: false,
};
pub const BIND: Setting = Setting {
    flag: "bind",
    env: "HYPD_BIND",
    secret: false,
};
pub const DATA_DIR: Setting = Setting {
    flag: "data-dir",
    env: "HYPD_DATA_DIR",
    secret: false,
};
pub const DATABASE_URL: Setting = Setting {
    flag: "database-url",
    env: "HYPD_DATABASE_URL",
    secret: true,
};
pub const SITE_ROOT: Setting = Setting {
    flag: "site-root",
    env: "HYPD_SITE_ROOT",
    secret: false,
};
pub const SANDBOX: Setting = Setting {
    flag: "sandbox",
    env: "HYPD_SANDBOX",
    secret: false,
};
pub const LOG_FORMAT: Setting = Setting {
    flag: "log-format",
    env: "HYPD_LOG_FORMAT",
    secret: false,
};
pub const LOG: Setting = Setting {
    flag: "log",
    env: "HYPD_LOG",
    secret: false,
};
pub const URL: Setting = Setting {
    flag: "url",
    env: "HYPD_URL",
    secret: false,
};
pub const TOKEN: Setting = Setting {
    flag: "token",
    env: "HYPD_TOKEN",
    secret: true,
};

pub const ALLOWED_HOSTS: Setting = Setting {
    flag: "allowed-hosts",
    env: "HYPD_ALLOWED_HOSTS",
    secret: false,
};
pub const RATE_LIMIT: Setting = Setting {
    flag: "rate-limit",
    env: "HYPD_RATE_LIMIT",
    secret: false,
};
pub const IDLE_TIMEOUT: Setting = Setting {
    flag: "idle-timeout",
    env: "HYPD_IDLE_TIMEOUT",
    secret: false,
};
pub const MAX_CONNECTIONS: Setting = Setting {
    flag: "max-connections",
    env: "HYPD_MAX_CONNECTIONS",
    secret: false,
};
pub const AUDIT_RETENTION: Setting = Setting {
    flag: "audit-retention-days",
    env: "HYPD_AUDIT_RETENTION_DAYS",
    secret: false,
};
pub const EVENT_RETENTION: Setting = Setting {
    flag: "event-retention-days",
    env: "HYPD_EVENT_RETENTION_DAYS",
    secret: false,
};

pub const MIN_POLL_INTERVAL: Setting = Setting {
    flag: "min-poll-interval",
    env: "HYPD_MIN_POLL_INTERVAL",
    secret: false,
};
pub const RETRY_BACKOFF: Setting = Setting {
    flag: "retry-backoff",
    env: "HYPD_RETRY_BACKOFF",
    secret: false,
};
pub const WARM_CATALOGUE: Setting = Setting {
    flag: "warm-catalogue",
    env: "HYPD_WARM_CATALOGUE",
    secret: false,
};

/// Every variable hypd reads; anything else spelled `HYPD_*` is probably a typo.
pub const KNOWN_VARIABLES: &[&str] = &[
    PORT.env,
    BIND.env,
    DATA_DIR.env,
    DATABASE_URL.env,
    SITE_ROOT.env,
    SANDBOX.env,
    LOG_FORMAT.env,
    LOG.env,
    URL.env,
    TOKEN.env,
    ALLOWED_HOSTS.env,
    RATE_LIMIT.env,
    IDLE_TIMEOUT.env,
    MAX_CONNECTIONS.env,
    AUDIT_RETENTION.env,
    EVENT_RETENTION.env,
    MIN_POLL_INTERVAL.env,
    RETRY_BACKOFF.env,
    WARM_CATALOGUE.env,
    "HYPD_MOTO_SERVER",
    "HYPD_SIM_BIN",
    // Read by scripts/, not by hypd; known so they are not reported as typos.
    "HYPD_VENV",
    "HYPD_BINARYEN",
    "HYPD_RELEASE",
];

/// Reads settings from parsed flags and an environment (a closure, so tests need not
/// touch the process environment).
pub struct Resolver<'a> {
    env: &'a dyn Fn(&str) -> Option<String>,
}

impl<'a> Resolver<'a> {
    pub fn new(env: &'a dyn Fn(&str) -> Option<String>) -> Self {
        Self { env }
    }

    /// The raw value and where it came from, if the setting was given at all.
    fn raw(&self, setting: &Setting, flag: Option<&str>) -> Option<(String, Origin)> {
        if let Some(v) = flag {
            return Some((v.to_owned(), Origin::Flag(setting.flag)));
        }
        (self.env)(setting.env).map(|v| (v, Origin::Env(setting.env)))
    }

    pub fn get<T>(
        &self,
        setting: &Setting,
        flag: Option<&str>,
        parse: impl Fn(&str) -> Result<T, &'static str>,
    ) -> Result<Option<T>, ConfigError> {
        let Some((raw, origin)) = self.raw(setting, flag) else {
            return Ok(None);
        };
        parse(&raw).map(Some).map_err(|rule| ConfigError::Invalid {
            origin,
            shown: if setting.secret {
                "(hidden)".to_owned()
            } else {
                format!("{raw:?}")
            },
            rule,
        })
    }

    /// Names of `HYPD_*` variables that hypd does not know.
    pub fn unknown_variables(vars: impl Iterator<Item = String>) -> Vec<String> {
        vars.filter(|k| k.starts_with("HYPD_") && !KNOWN_VARIABLES.contains(&k.as_str()))
            .collect()
    }
}

pub fn parse_port(s: &str) -> Result<u16, &'static str> {
    s.trim()
        .parse::<u16>()
        .map_err(|_| "must be a TCP port number from 0 to 65535 (0 picks a free port)")
}

pub fn parse_ip(s: &str) -> Result<IpAddr, &'static str> {
    IpAddr::from_str(s.trim())
        .map_err(|_| "must be an IPv4 or IPv6 address, e.g. 127.0.0.1 or 0.0.0.0")
}

pub fn parse_url(s: &str) -> Result<String, &'static str> {
    let s = s.trim().trim_end_matches('/');
    let rest = s
        .strip_prefix("http://")
        .or_else(|| s.strip_prefix("https://"));
    match rest {
        Some(host) if !host.is_empty() && !host.contains(char::is_whitespace) => Ok(s.to_owned()),
        _ => Err("must be an http:// or https:// URL, e.g. http://127.0.0.1:3099"),
    }
}

pub fn parse_bool(s: &str) -> Result<bool, &'static str> {
    match s.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" | "" => Ok(false),
        _ => Err("must be true or false (also 1/0, yes/no, on/off)"),
    }
}

pub fn parse_path(s: &str) -> Result<PathBuf, &'static str> {
    if s.trim().is_empty() {
        Err("must be a non-empty path")
    } else {
        Ok(PathBuf::from(s))
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    Human,
    Json,
}

pub fn parse_log_format(s: &str) -> Result<LogFormat, &'static str> {
    match s.trim().to_ascii_lowercase().as_str() {
        "human" | "text" => Ok(LogFormat::Human),
        "json" => Ok(LogFormat::Json),
        _ => Err("must be human or json"),
    }
}

pub fn parse_log_filter(s: &str) -> Result<String, &'static str> {
    tracing_subscriber::EnvFilter::try_new(s)
        .map(|_| s.to_owned())
        .map_err(|_| "must be a tracing filter such as info, debug or hypd=debug,tower_http=info")
}

/// The `Host` names hypd answers to, beyond the loopback names it always accepts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HostList {
    /// `*`: any Host.
    Any,
    /// Lowercase host names and IP literals (IPv6 in brackets), without ports.
    Names(Vec<String>),
}

/// A comma-separated list of host names or IP addresses (`hypd.internal,10.0.0.5`), or
/// `*` for any.
pub fn parse_allowed_hosts(s: &str) -> Result<HostList, &'static str> {
    const RULE: &str = "must be a comma-separated list of host names or IP addresses without scheme, port or path (e.g. hypd.internal,10.0.0.5,[fd00::1]), or * for any host";
    let mut names = Vec::new();
    for entry in s.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        if entry == "*" {
            return Ok(HostList::Any);
        }
        let entry = entry.to_ascii_lowercase();
        let bare = entry
            .strip_prefix('[')
            .and_then(|e| e.strip_suffix(']'))
            .unwrap_or(&entry);
        if let Ok(ip) = bare.parse::<IpAddr>() {
            names.push(match ip {
                IpAddr::V4(v4) => v4.to_string(),
                IpAddr::V6(v6) => format!("[{v6}]"),
            });
            continue;
        }
        let name = entry.strip_suffix('.').unwrap_or(&entry);
        let label_ok = |l: &str| {
            (1..=63).contains(&l.len())
                && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        };
        if name.len() > 253 || !name.split('.').all(label_ok) {
            return Err(RULE);
        }
        names.push(name.to_owned());
    }
    if names.is_empty() {
        return Err(RULE);
    }
    Ok(HostList::Names(names))
}

/// Requests per second each token (or session, or anonymous address) may send.
pub fn parse_rate_limit(s: &str) -> Result<u32, &'static str> {
    s.trim()
        .parse::<u32>()
        .ok()
        .filter(|n| *n <= 100_000)
        .ok_or("must be a whole number of requests per second from 0 (no limit) to 100000")
}

/// Seconds a connection may sit idle between requests.
pub fn parse_idle_timeout(s: &str) -> Result<u64, &'static str> {
    s.trim()
        .parse::<u64>()
        .ok()
        .filter(|n| (1..=3600).contains(n))
        .ok_or("must be a whole number of seconds from 1 to 3600")
}

pub fn parse_max_connections(s: &str) -> Result<usize, &'static str> {
    s.trim()
        .parse::<usize>()
        .ok()
        .filter(|n| (1..=1_000_000).contains(n))
        .ok_or("must be a whole number of connections from 1 to 1000000")
}

/// Days to keep rows before pruning them; 0 keeps them for ever.
pub fn parse_retention_days(s: &str) -> Result<u32, &'static str> {
    s.trim()
        .parse::<u32>()
        .ok()
        .filter(|n| *n <= 36_500)
        .ok_or("must be a whole number of days from 0 (keep for ever) to 36500")
}

/// A wait of the operations worker: `250ms`, `1s`, `1.5s` (a bare number is seconds),
/// from 10 ms to a minute. Below 10 ms a waiting stage would poll its provider in a
/// loop; above a minute is past the worker's own longest wait.
pub fn parse_pace(s: &str) -> Result<std::time::Duration, &'static str> {
    const RULE: &str = "must be a duration from 10ms to 60s, e.g. 1s, 250ms or 1.5s";
    let s = s.trim();
    let (number, unit) = match s.strip_suffix("ms") {
        Some(n) => (n, 0.001),
        None => (s.strip_suffix('s').unwrap_or(s), 1.0),
    };
    let secs = number
        .trim()
        .parse::<f64>()
        .ok()
        .filter(|n| n.is_finite())
        .map(|n| n * unit)
        .ok_or(RULE)?;
    if !(0.01..=60.0).contains(&secs) {
        return Err(RULE);
    }
    Ok(std::time::Duration::from_secs_f64(secs))
}

/// Where operations and tokens are stored.
#[derive(Clone, PartialEq, Eq)]
pub enum Database {
    /// A SQLite file: the default, one replica.
    Sqlite(PathBuf),
    /// A PostgreSQL URL: for several replicas sharing one store.
    Postgres(String),
}

// The URL may hold a password: never print it.
impl fmt::Debug for Database {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Database::Sqlite(p) => f.debug_tuple("Sqlite").field(p).finish(),
            Database::Postgres(_) => f.write_str("Postgres(<url hidden>)"),
        }
    }
}

impl Database {
    /// A description safe for logs.
    pub fn describe(&self) -> String {
        match self {
            Database::Sqlite(p) => format!("sqlite:{}", p.display()),
            Database::Postgres(url) => {
                // Show host and database only: user names and passwords stay out of logs.
                let rest = url.split_once("://").map_or("", |(_, r)| r);
                let host_db = rest.rsplit_once('@').map_or(rest, |(_, h)| h);
                let host_db = host_db.split('?').next().unwrap_or_default();
                format!("postgres://{host_db}")
            }
        }
    }
}

pub fn parse_database_url(s: &str) -> Result<Database, &'static str> {
    const RULE: &str =
        "must be postgres://user:password@host:port/database, or sqlite:PATH for a SQLite file";
    let s = s.trim();
    if let Some(rest) = s
        .strip_prefix("postgres://")
        .or_else(|| s.strip_prefix("postgresql://"))
    {
        if rest.is_empty() || rest == "/" {
            return Err(RULE);
        }
        return Ok(Database::Postgres(s.to_owned()));
    }
    if let Some(path) = s
        .strip_prefix("sqlite://")
        .or_else(|| s.strip_prefix("sqlite:"))
    {
        let path = path.split('?').next().unwrap_or_default();
        if path.is_empty() {
            return Err(RULE);
        }
        return Ok(Database::Sqlite(PathBuf::from(path)));
    }
    Err(RULE)
}

/// The default data directory: `$XDG_DATA_HOME/hypd`, else `~/.local/share/hypd`.
pub fn default_data_dir(env: &dyn Fn(&str) -> Option<String>) -> PathBuf {
    if let Some(x) = env("XDG_DATA_HOME").filter(|s| !s.is_empty()) {
        return PathBuf::from(x).join("hypd");
    }
    if let Some(h) = env("HOME").filter(|s| !s.is_empty()) {
        return PathBuf::from(h).join(".local/share/hypd");
    }
    PathBuf::from("hypd-data")
}

pub const DEFAULT_BIND: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

/// What one caller may ask of hypd on the way in (`faces::limits`, `faces::listener`),
/// with the defaults the README documents.
#[derive(Clone, Debug, PartialEq)]
pub struct Limits {
    /// Largest request body: requests are decision-level JSON of a few kB, so 1 MiB
    /// leaves room for any command to grow while no single request can be made costly.
    pub body_bytes: usize,
    /// Sustained requests per second per token or session (0: no limit).
    pub rate_per_second: u32,
    /// How many seconds' worth of requests may come at once (a page load, an agent's
    /// burst of tool calls).
    pub burst_seconds: u32,
    /// A request's line and headers must arrive within this of the connection opening or
    /// of their first byte.
    pub header_timeout: Duration,
    /// A connection with no request in flight is closed after this.
    pub idle_timeout: Duration,
    /// Connections served at once.
    pub max_connections: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            body_bytes: 1 << 20,
            rate_per_second: 20,
            burst_seconds: 5,
            header_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            max_connections: 1024,
        }
    }
}

/// Everything `hypd serve` needs, resolved and checked.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    pub bind: std::net::IpAddr,
    pub port: u16,
    pub data_dir: PathBuf,
    pub database: Database,
    pub site_root: PathBuf,
    pub sandbox: bool,
    /// `Host` names served; `None` serves any.
    pub allowed_hosts: Option<Vec<String>>,
    pub limits: Limits,
    pub retention: Retention,
    pub pace: Pace,
    /// Whether the inspection catalogue (regions, zones, instance types) is read at start.
    pub warm_catalogue: bool,
}

#[derive(Debug, Clone)]
pub struct LogConfig {
    pub format: LogFormat,
    pub filter: String,
}

/// How long rows are kept, in days (`retention`); 0 keeps them for ever.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Retention {
    pub audit_days: u32,
    pub event_days: u32,
}

impl Retention {
    /// A year of audit (what reviews and most compliance regimes ask for) and a quarter
    /// of engine events (enough to debug any operation someone still remembers).
    pub const DEFAULT: Retention = Retention {
        audit_days: 365,
        event_days: 90,
    };
}

/// The worker's real-time floors (`--min-poll-interval`, `--retry-backoff`): how soon a
/// waiting stage looks at the world again, and how long it first waits after a transient
/// failure. The defaults suit AWS, whose transitions take seconds to minutes and whose
/// throttling wants room; a faster world (the sandbox's scaled clock) may set them lower.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pace {
    /// The shortest wait between two polls of a waiting stage.
    pub min_poll: Duration,
    /// The wait after a stage's first transient failure; it doubles with each failure in
    /// a row, up to a minute.
    pub retry_backoff: Duration,
}

impl Pace {
    pub const DEFAULT: Pace = Pace {
        min_poll: Duration::from_secs(1),
        retry_backoff: Duration::from_secs(2),
    };
}

impl Default for Pace {
    fn default() -> Self {
        Self::DEFAULT
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| map.get(k).cloned()
    }

    #[test]
    fn flag_wins_over_variable() {
        let env = env_of(&[("HYPD_PORT", "4000")]);
        let r = Resolver::new(&env);
        assert_eq!(r.get(&PORT, Some("5000"), parse_port).unwrap(), Some(5000));
        assert_eq!(r.get(&PORT, None, parse_port).unwrap(), Some(4000));
    }

    #[test]
    fn bad_variable_names_the_variable_and_rule() {
        let env = env_of(&[("HYPD_PORT", "99999")]);
        let err = Resolver::new(&env)
            .get(&PORT, None, parse_port)
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid value \"99999\" for HYPD_PORT: must be a TCP port number from 0 to 65535 (0 picks a free port)"
        );
    }

    #[test]
    fn bad_flag_names_the_flag() {
        let env = env_of(&[]);
        let err = Resolver::new(&env)
            .get(&LOG_FORMAT, Some("xml"), parse_log_format)
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid value \"xml\" for --log-format: must be human or json"
        );
    }

    #[test]
    fn secret_values_are_not_echoed() {
        let env = env_of(&[("HYPD_DATABASE_URL", "mysql://root:hunter2@db/x")]);
        let err = Resolver::new(&env)
            .get(&DATABASE_URL, None, parse_database_url)
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("invalid value (hidden) for HYPD_DATABASE_URL: must be postgres://")
        );
        assert!(!err.contains("hunter2"));
    }

    #[test]
    fn database_urls() {
        assert_eq!(
            parse_database_url("sqlite:/tmp/x.db").unwrap(),
            Database::Sqlite("/tmp/x.db".into())
        );
        let pg = parse_database_url("postgres://u:secret@db.internal:5432/hypd?sslmode=require")
            .unwrap();
        assert_eq!(pg.describe(), "postgres://db.internal:5432/hypd");
        assert!(!format!("{pg:?}").contains("secret"));
        assert!(parse_database_url("postgres://").is_err());
        assert!(parse_database_url("sqlite:").is_err());
        assert!(parse_database_url("redis://x").is_err());
    }

    #[test]
    fn booleans_and_formats() {
        assert_eq!(parse_bool("Yes"), Ok(true));
        assert_eq!(parse_bool("0"), Ok(false));
        assert!(parse_bool("maybe").is_err());
        assert_eq!(parse_log_format("JSON"), Ok(LogFormat::Json));
        assert!(parse_log_filter("hypd=debug,info").is_ok());
        assert!(parse_log_filter("hypd=loud").is_err());
        assert!(parse_ip("0.0.0.0").is_ok());
        assert!(parse_ip("localhost").is_err());
    }

    #[test]
    fn allowed_hosts() {
        assert_eq!(
            parse_allowed_hosts("Hypd.Internal, 10.0.0.5,[FD00::1],fd00::2,ssm.example.").unwrap(),
            HostList::Names(
                [
                    "hypd.internal",
                    "10.0.0.5",
                    "[fd00::1]",
                    "[fd00::2]",
                    "ssm.example"
                ]
                .map(String::from)
                .to_vec()
            )
        );
        assert_eq!(parse_allowed_hosts("a.example,*"), Ok(HostList::Any));
        for bad in [
            "",
            " , ",
            "http://hypd.internal",
            "hypd.internal:3099",
            "hypd.internal/x",
            "-bad.example",
            "under_score.example",
        ] {
            assert!(parse_allowed_hosts(bad).is_err(), "{bad}");
        }
        let env = env_of(&[("HYPD_ALLOWED_HOSTS", "hypd.internal:3099")]);
        let err = Resolver::new(&env)
            .get(&ALLOWED_HOSTS, None, parse_allowed_hosts)
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("invalid value \"hypd.internal:3099\" for HYPD_ALLOWED_HOSTS: must be a comma-separated list of host names"),
            "{err}"
        );
    }

    #[test]
    fn limits_and_retention() {
        assert_eq!(parse_rate_limit("0"), Ok(0));
        assert!(parse_rate_limit("-1").is_err());
        assert_eq!(parse_idle_timeout("60"), Ok(60));
        assert!(parse_idle_timeout("0").is_err());
        assert_eq!(parse_max_connections("1024"), Ok(1024));
        assert!(parse_max_connections("0").is_err());
        assert_eq!(parse_retention_days("0"), Ok(0));
        assert!(parse_retention_days("forever").is_err());
    }

    #[test]
    fn paces_are_durations_within_bounds() {
        use std::time::Duration;
        assert_eq!(parse_pace("1s"), Ok(Duration::from_secs(1)));
        assert_eq!(parse_pace(" 250ms "), Ok(Duration::from_millis(250)));
        assert_eq!(parse_pace("1.5"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_pace("10ms"), Ok(Duration::from_millis(10)));
        for bad in ["", "5ms", "61s", "fast", "-1s", "NaN", "1m"] {
            assert!(parse_pace(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn unknown_variables_are_found() {
        let vars = ["HYPD_PROT", "HYPD_PORT", "HOME"].map(String::from);
        assert_eq!(
            Resolver::unknown_variables(vars.into_iter()),
            vec!["HYPD_PROT"]
        );
    }

    #[test]
    fn data_dir_follows_xdg() {
        assert_eq!(
            default_data_dir(&env_of(&[("XDG_DATA_HOME", "/x"), ("HOME", "/h")])),
            PathBuf::from("/x/hypd")
        );
        assert_eq!(
            default_data_dir(&env_of(&[("HOME", "/h")])),
            PathBuf::from("/h/.local/share/hypd")
        );
    }
}
