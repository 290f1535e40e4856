//! Signing in and out, and who is signed in. Sign-in trades a token for an HttpOnly
//! session cookie at `POST /auth/login`: the page never keeps the token, and after either
//! step the browser loads the next page afresh so the server renders it for the new
//! session. What a role may do is decided by the server; the console only hides what
//! would be refused.

use leptos::either::{Either, EitherOf3};
use leptos::prelude::*;
use leptos_router::hooks::{use_location, use_query_map};

use crate::api::{ApiError, Role};
use crate::console::Me;
use crate::form::{FormAlert, FormState};

pub fn use_me() -> Option<Me> {
    use_context::<Me>()
}

/// The name and role in the top bar, with the sign-out button; or a sign-in link.
#[component]
pub fn UserMenu() -> impl IntoView {
    let me = use_me();
    view! {
        <Suspense fallback=|| ()>
            {move || Suspend::new(async move {
                let Some(me) = me else { return EitherOf3::A(()) };
                match me.await {
                    Ok(who) => {
                        EitherOf3::B(view! {
                            <span class="user" data-role=who.role.as_str()>
                                <span class="user-name">{who.token_name}</span>
                                <span class="badge role">{who.role.as_str()}</span>
                            </span>
                            <SignOut/>
                        })
                    }
                    Err(_) => EitherOf3::C(view! { <a class="button" href="/login">"Sign in"</a> }),
                }
            })}
        </Suspense>
    }
}

#[component]
fn SignOut() -> impl IntoView {
    let failed = RwSignal::new(None::<String>);
    let sign_out = move |_| {
        #[cfg(feature = "hydrate")]
        leptos::task::spawn_local(async move {
            match browser::post_json("/auth/logout", &serde_json::json!({})).await {
                Ok(()) => browser::go("/login"),
                Err(e) => failed.set(Some(e.to_string())),
            }
        });
    };
    view! {
        <button class="sign-out" type="button" on:click=sign_out>
            "Sign out"
        </button>
        {move || failed.get().map(|e| view! { <span class="error">{e}</span> })}
    }
}

/// Where to go after signing in: a path on this console, never another site.
///
/// Browsers read `/\host` and `//host` as another host, and drop tabs and newlines
/// before they parse (`/\t/host` is `//host`), so a path qualifies only when neither it
/// nor any percent-decoding of it starts with two slashes or holds a backslash, a
/// control character or white space.
fn safe_next(next: Option<String>) -> String {
    const HOME: &str = "/clusters";
    let Some(next) = next else {
        return HOME.to_owned();
    };
    let mut form = next.clone();
    // Each round decodes one layer; a path that still changes after a few is not ours.
    for _ in 0..4 {
        let unsafe_form = !form.starts_with('/')
            || form.starts_with("//")
            || form.starts_with("/login")
            || form
                .chars()
                .any(|c| c == '\\' || c.is_control() || c.is_whitespace());
        if unsafe_form {
            return HOME.to_owned();
        }
        let decoded = crate::text::percent_decode(&form);
        if decoded == form {
            return next;
        }
        form = decoded;
    }
    HOME.to_owned()
}

#[component]
pub fn SignIn() -> impl IntoView {
    let query = use_query_map();
    let next = move || safe_next(query.with(|q| q.get("next")));
    let token = RwSignal::new(String::new());
    let form = FormState::new(&["token"]);
    let submit = move |ev: leptos::ev::SubmitEvent| {
        ev.prevent_default();
        form.clear();
        let secret = token.get_untracked().trim().to_owned();
        if secret.is_empty() {
            form.show(ApiError::field("token", "paste an API token (hypd_…)"));
        } else {
            sign_in(form, secret, next());
        }
    };
    view! {
        <section class="panel narrow">
            <h1>"Sign in"</h1>
            <p class="muted">
                "Paste an API token. The first admin token is in "
                <code>"<data dir>/admin-token"</code>
                " (in the sandbox: "
                <code>"<data dir>/sandbox/admin-token"</code>
                "). The console keeps only a session cookie, never the token."
            </p>
            <form class="form" on:submit=submit novalidate>
                <div class="field" class:invalid=move || !form.errors_for("token").is_empty() data-field="token">
                    <label for="token">"API token"</label>
                    <input
                        id="token"
                        name="token"
                        type="password"
                        autocomplete="off"
                        placeholder="hypd_…"
                        aria-invalid=move || if form.errors_for("token").is_empty() { "false" } else { "true" }
                        aria-describedby="token-error"
                        prop:value=move || token.get()
                        on:input=move |ev| token.set(event_target_value(&ev))
                    />
                    <div class="field-error" id="token-error" role="alert" aria-live="polite">
                        {move || form.errors_for("token").into_iter().map(|m| view! { <p>{m}</p> }).collect_view()}
                    </div>
                </div>
                <FormAlert form/>
                <div class="actions">
                    <button class="primary" type="submit" disabled=move || form.busy.get()>
                        {move || if form.busy.get() { "Signing in…" } else { "Sign in" }}
                    </button>
                </div>
            </form>
        </section>
    }
}

/// Trades the token for a session cookie, then loads `next` afresh (browser only).
fn sign_in(form: FormState, secret: String, next: String) {
    #[cfg(feature = "hydrate")]
    {
        let body = serde_json::json!({ "token": secret });
        form.busy.set(true);
        leptos::task::spawn_local(async move {
            match browser::post_json("/auth/login", &body).await {
                Ok(()) => browser::go(&next),
                Err(e) => {
                    form.busy.set(false);
                    // A refused token is this field's problem, not the page's.
                    let e = match e {
                        ApiError::Unauthorized { message } => ApiError::field("token", message),
                        other => other,
                    };
                    form.show(e);
                }
            }
        });
    }
    #[cfg(not(feature = "hydrate"))]
    let _ = (form, secret, next);
}

/// Shown in place of a page the caller may not see: sign in, or ask for a role.
#[component]
pub fn ErrorPanel(error: ApiError) -> impl IntoView {
    let location = use_location();
    let here = location.pathname.get_untracked();
    match error {
        ApiError::Unauthorized { .. } => Either::Left(view! {
            <section class="panel narrow" data-error="unauthorized">
                <h1>"Sign in to continue"</h1>
                <p>"This page needs a signed-in session."</p>
                <a class="button primary" href=format!("/login?next={here}")>"Sign in"</a>
            </section>
        }),
        other => Either::Right(view! {
            <div class="form-alert" role="alert" data-error=error_kind(&other)>
                {other.to_string()}
            </div>
        }),
    }
}

fn error_kind(e: &ApiError) -> &'static str {
    match e {
        ApiError::Validation { .. } => "validation",
        ApiError::NotFound { .. } => "not_found",
        ApiError::Conflict { .. } => "conflict",
        ApiError::Immutable { .. } => "immutable",
        ApiError::Upstream { .. } => "upstream",
        ApiError::Unauthorized { .. } => "unauthorized",
        ApiError::Forbidden { .. } => "forbidden",
        ApiError::TooLarge { .. } => "too_large",
        ApiError::RateLimited { .. } => "rate_limited",
        ApiError::Unavailable { .. } => "unavailable",
        ApiError::Internal { .. } => "internal",
    }
}

/// Renders `children` only for a signed-in caller whose role reaches `role`.
#[component]
pub fn IfRole(role: Role, children: ChildrenFn) -> impl IntoView {
    let me = use_me();
    let children = StoredValue::new(children);
    view! {
        <Suspense fallback=|| ()>
            {move || Suspend::new(async move {
                let allowed = match me {
                    Some(me) => matches!(me.await, Ok(who) if who.role >= role),
                    None => false,
                };
                allowed.then(|| children.read_value()())
            })}
        </Suspense>
    }
}

#[cfg(feature = "hydrate")]
pub(crate) mod browser {
    use gloo_net::http::Request;

    use crate::api::ApiError;

    /// POSTs JSON to one of the console's own endpoints; an error answer (`{"error": …}`)
    /// is decoded as the API's error type.
    pub async fn post_json(url: &str, body: &serde_json::Value) -> Result<(), ApiError> {
        let response = Request::post(url)
            .json(body)
            .map_err(ApiError::internal)?
            .send()
            .await
            .map_err(|e| ApiError::internal(format!("the server did not answer: {e}")))?;
        if response.ok() {
            return Ok(());
        }
        #[derive(serde::Deserialize)]
        struct Refusal {
            error: ApiError,
        }
        let status = response.status();
        Err(response
            .json::<Refusal>()
            .await
            .map(|r| r.error)
            .unwrap_or_else(|_| ApiError::internal(format!("HTTP {status}"))))
    }

    /// A full page load, so the server renders the next page for the new session.
    pub fn go(path: &str) {
        if let Some(window) = web_sys::window() {
            let _ = window.location().assign(path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn next_stays_on_this_console() {
        assert_eq!(
            safe_next(Some("/operations/op-1".into())),
            "/operations/op-1"
        );
        for bad in [
            "//evil.example",
            "https://evil.example",
            "/login?next=/x",
            "",
            // What `/login?next=/%5Cevil.example` decodes to: browsers go to evil.example.
            "/\\evil.example",
            "/%5Cevil.example",
            "/%5cevil.example",
            "/%2F/evil.example",
            "/%2f%2fevil.example",
            "/%252F/evil.example",
            "/\t/evil.example",
            "/%09/evil.example",
            "/\n/evil.example",
            "/%0A/evil.example",
            "/ /evil.example",
            "/\u{7f}x",
        ] {
            assert_eq!(safe_next(Some(bad.into())), "/clusters", "{bad:?}");
        }
        assert_eq!(safe_next(None), "/clusters");
        // Ordinary paths with queries and escapes of ordinary characters pass unchanged.
        assert_eq!(
            safe_next(Some("/operations?state=running".into())),
            "/operations?state=running"
        );
        assert_eq!(
            safe_next(Some("/clusters/ml-1%2Dx".into())),
            "/clusters/ml-1%2Dx"
        );
    }
}
