//! Misconfiguration stops hypd before it does anything, with one line naming the flag or
//! variable and the rule, and exit code 2.

use std::process::Output;

fn run(args: &[&str], envs: &[(&str, &str)]) -> Output {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = crate::common::hypd_command(dir.path());
    cmd.args(args);
    for (k, v) in envs {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

fn assert_usage_error(out: &Output, must_contain: &[&str]) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "stderr: {stderr}");
    assert_eq!(
        stderr.trim_end().lines().count(),
        1,
        "one line expected, got: {stderr}"
    );
    assert!(stderr.starts_with("hypd: "), "{stderr}");
    for s in must_contain {
        assert!(stderr.contains(s), "{stderr:?} should contain {s:?}");
    }
}

#[test]
fn bad_port_variable_names_the_variable() {
    let out = run(&["serve"], &[("HYPD_PORT", "http")]);
    assert_usage_error(
        &out,
        &["HYPD_PORT", "\"http\"", "TCP port number from 0 to 65535"],
    );
}

#[test]
fn bad_port_flag_names_the_flag() {
    let out = run(&["serve", "--port", "70000"], &[]);
    assert_usage_error(&out, &["--port", "70000"]);
}

#[test]
fn bad_log_format_names_the_variable() {
    let out = run(&["serve"], &[("HYPD_LOG_FORMAT", "xml")]);
    assert_usage_error(&out, &["HYPD_LOG_FORMAT", "human or json"]);
}

#[test]
fn bad_bind_and_sandbox_values() {
    assert_usage_error(
        &run(&["serve"], &[("HYPD_BIND", "localhost")]),
        &["HYPD_BIND", "IPv4 or IPv6"],
    );
    assert_usage_error(
        &run(&["serve"], &[("HYPD_SANDBOX", "perhaps")]),
        &["HYPD_SANDBOX", "true or false"],
    );
}

#[test]
fn bad_database_url_is_named_but_not_echoed() {
    let out = run(
        &["serve"],
        &[("HYPD_DATABASE_URL", "mysql://admin:hunter2@db/hypd")],
    );
    assert_usage_error(&out, &["HYPD_DATABASE_URL", "postgres://"]);
    assert!(!String::from_utf8_lossy(&out.stderr).contains("hunter2"));
}

#[test]
fn unknown_flag_is_one_line() {
    let out = run(&["serve", "--frobnicate"], &[]);
    assert_usage_error(&out, &["--frobnicate", "hypd --help"]);
}

#[test]
fn unknown_subcommand_is_one_line() {
    let out = run(&["launch"], &[]);
    assert_usage_error(&out, &["launch"]);
}

#[test]
fn help_lists_commands_and_variables() {
    let out = run(&["--help"], &[]);
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("serve"), "{text}");

    let out = run(&["serve", "--help"], &[]);
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8_lossy(&out.stdout);
    for s in [
        "HYPD_PORT",
        "HYPD_DATA_DIR",
        "HYPD_DATABASE_URL",
        "HYPD_LOG_FORMAT",
        "--sandbox",
    ] {
        assert!(text.contains(s), "serve --help should mention {s}: {text}");
    }
}

#[test]
fn unreachable_postgres_fails_without_leaking_the_password() {
    let port = crate::common::free_port();
    let url = format!("postgres://hypd:s3cr3t-pw@127.0.0.1:{port}/hypd");
    let out = run(&["serve"], &[("HYPD_DATABASE_URL", &url)]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("cannot open the postgres store"),
        "{stderr}"
    );
    assert!(!stderr.contains("s3cr3t-pw"), "{stderr}");
}

#[test]
fn bad_limits_name_their_setting() {
    assert_usage_error(
        &run(
            &["serve"],
            &[("HYPD_ALLOWED_HOSTS", "http://hypd.internal:3099")],
        ),
        &[
            "HYPD_ALLOWED_HOSTS",
            "comma-separated list of host names or IP addresses",
        ],
    );
    assert_usage_error(
        &run(&["serve", "--rate-limit", "fast"], &[]),
        &["--rate-limit", "requests per second"],
    );
    assert_usage_error(
        &run(&["serve"], &[("HYPD_IDLE_TIMEOUT", "0")]),
        &["HYPD_IDLE_TIMEOUT", "1 to 3600"],
    );
    assert_usage_error(
        &run(&["serve"], &[("HYPD_AUDIT_RETENTION_DAYS", "-1")]),
        &["HYPD_AUDIT_RETENTION_DAYS", "0 (keep for ever)"],
    );
    assert_usage_error(
        &run(&["serve", "--warm-catalogue", "later"], &[]),
        &["--warm-catalogue", "must be true or false"],
    );
}

#[test]
fn agent_install_writes_the_kiro_agent_naming_the_token_file_not_the_token() {
    let home = tempfile::tempdir().unwrap();
    let token = home.path().join("token");
    std::fs::write(&token, "hypd_secret_agent_token_1234\n").unwrap();
    let kiro = home.path().join("kiro-agents");
    let out = run(
        &["agent", "install", "--url", "http://127.0.0.1:4000"],
        &[
            ("KIRO_AGENT_CONFIG_DIR", kiro.to_str().unwrap()),
            ("HYPD_DATA_DIR", home.path().join("data").to_str().unwrap()),
            ("HOME", home.path().to_str().unwrap()),
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(kiro.join("hypd-inst-agent.json")).unwrap();
    let agent: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        agent["mcpServers"]["hypd"]["args"],
        serde_json::json!(["mcp", "--url", "http://127.0.0.1:4000"])
    );
    assert!(
        home.path()
            .join("data/playbooks/create-cluster.md")
            .exists()
    );
    let with_token = run(
        &["agent", "install", "--token-file", token.to_str().unwrap()],
        &[
            ("KIRO_AGENT_CONFIG_DIR", kiro.to_str().unwrap()),
            ("HYPD_DATA_DIR", home.path().join("data").to_str().unwrap()),
        ],
    );
    assert!(with_token.status.success());
    let text = std::fs::read_to_string(kiro.join("hypd-inst-agent.json")).unwrap();
    assert!(
        text.contains(token.to_str().unwrap()) && !text.contains("hypd_secret_agent_token"),
        "{text}"
    );
    // A token file that cannot be read is refused now, not inside Kiro later.
    assert_usage_error(
        &run(
            &["agent", "install", "--token-file", "/nonexistent/token"],
            &[("KIRO_AGENT_CONFIG_DIR", kiro.to_str().unwrap())],
        ),
        &["/nonexistent/token"],
    );
}
