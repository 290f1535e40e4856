//! The live channel: operation changes are pushed over a WebSocket, and a browser
//! session from another origin cannot open it.

use crate::common::Hypd;
use futures_util::StreamExt;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::{Error, Message};

fn write_operation(hypd: &Hypd, id: &str, state: &str) {
    // SQLite's own clock, in the store's format (milliseconds, Z).
    let now = "strftime('%Y-%m-%dT%H:%M:%fZ', 'now')";
    let written = hypd.sql(&format!(
        "INSERT INTO operations (id, command, target, state, created_at, updated_at) \
         VALUES ('{id}', 'create_cluster', 'cluster/ml-1', '{state}', {now}, {now}) \
         ON CONFLICT(id) DO UPDATE SET state = excluded.state, updated_at = excluded.updated_at"
    ));
    assert_eq!(written, 1);
}

/// A WebSocket upgrade as a browser page at `origin` sends it with the console session.
fn session_upgrade(
    url: &str,
    cookie: &str,
    origin: &str,
) -> tokio_tungstenite::tungstenite::handshake::client::Request {
    let mut request = url.into_client_request().unwrap();
    let headers = request.headers_mut();
    headers.insert("cookie", cookie.parse().unwrap());
    headers.insert("origin", origin.parse().unwrap());
    request
}

async fn next_json<S>(ws: &mut S) -> serde_json::Value
where
    S: futures_util::Stream<Item = Result<Message, Error>> + Unpin,
{
    loop {
        let msg = tokio::time::timeout(std::time::Duration::from_secs(10), ws.next())
            .await
            .expect("an event within 10 s")
            .expect("stream open")
            .expect("no error");
        if let Message::Text(t) = msg {
            return serde_json::from_str(&t).unwrap();
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn operation_changes_are_pushed_in_order() {
    let (hypd, token, _moto) = crate::common::hypd_with_moto();
    let url = format!("{}/api/v1/events", hypd.url.replace("http://", "ws://"));
    let mut request = url.as_str().into_client_request().unwrap();
    request
        .headers_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    let (mut ws, _) = tokio_tungstenite::connect_async(request).await.unwrap();
    assert_eq!(next_json(&mut ws).await["type"], "hello");

    write_operation(&hypd, "op-1", "running");
    let event = next_json(&mut ws).await;
    assert_eq!(event["type"], "operation");
    assert_eq!(event["operation"]["operation_id"], "op-1");
    assert_eq!(event["operation"]["state"], "running");

    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    write_operation(&hypd, "op-1", "succeeded");
    let event = next_json(&mut ws).await;
    assert_eq!(event["operation"]["state"], "succeeded");
}

#[tokio::test(flavor = "multi_thread")]
async fn refuses_missing_tokens_and_foreign_origins() {
    let (hypd, token, _moto) = crate::common::hypd_with_moto();
    let url = format!("{}/api/v1/events", hypd.url.replace("http://", "ws://"));
    let err = tokio_tungstenite::connect_async(url.as_str())
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::Http(r) if r.status() == 401),
        "{err:?}"
    );

    // A console session opened from another site's page.
    let login = reqwest::Client::new()
        .post(format!("{}/auth/login", hypd.url))
        .json(&serde_json::json!({ "token": token }))
        .send()
        .await
        .unwrap();
    let cookie = login.headers()["set-cookie"]
        .to_str()
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_owned();
    let request = session_upgrade(&url, &cookie, "http://evil.example");
    let err = tokio_tungstenite::connect_async(request).await.unwrap_err();
    assert!(
        matches!(&err, Error::Http(r) if r.status() == 403),
        "{err:?}"
    );

    let request = session_upgrade(&url, &cookie, &hypd.url);
    let (mut ws, _) = tokio_tungstenite::connect_async(request).await.unwrap();
    assert_eq!(next_json(&mut ws).await["subscriber"], "admin");
}

/// Revoking a token closes the sockets opened with it (code 4401), and they receive no
/// event written after the revocation.
#[tokio::test(flavor = "multi_thread")]
async fn revoking_a_token_closes_its_sockets() {
    let (hypd, admin, _moto) = crate::common::hypd_with_moto();
    let http = reqwest::Client::new();
    let created: serde_json::Value = http
        .post(format!("{}/api/v1/tokens", hypd.url))
        .bearer_auth(&admin)
        .json(&serde_json::json!({"name": "watcher", "role": "viewer"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let watcher = created["token"].as_str().unwrap().to_owned();
    let url = format!("{}/api/v1/events", hypd.url.replace("http://", "ws://"));
    let mut request = url.as_str().into_client_request().unwrap();
    request.headers_mut().insert(
        "authorization",
        format!("Bearer {watcher}").parse().unwrap(),
    );
    let (mut ws, _) = tokio_tungstenite::connect_async(request).await.unwrap();
    assert_eq!(next_json(&mut ws).await["subscriber"], "watcher");

    let url = format!("{}/api/v1/tokens/watcher", hypd.url);
    let revoke = |body: serde_json::Value| http.delete(&url).bearer_auth(&admin).json(&body).send();
    let plan: serde_json::Value = revoke(serde_json::json!({}))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let revoked = revoke(serde_json::json!({"confirmation": plan["confirmation"]}))
        .await
        .unwrap();
    assert_eq!(revoked.status(), 200);
    write_operation(&hypd, "op-after", "running");
    loop {
        let msg = tokio::time::timeout(std::time::Duration::from_secs(10), ws.next())
            .await
            .expect("the socket is closed within 10 s of the revocation");
        match msg {
            Some(Ok(Message::Close(Some(frame)))) => {
                assert_eq!(u16::from(frame.code), 4401);
                break;
            }
            Some(Ok(Message::Text(t))) => {
                panic!("an event reached a revoked token: {t}");
            }
            Some(Ok(_)) => {}
            other => panic!("closed without a close frame: {other:?}"),
        }
    }
}
