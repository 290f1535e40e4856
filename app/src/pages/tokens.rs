//! API tokens, for admins: the list, a form that creates one (its secret is shown once,
//! here, and never again), and revocation. The form declares `CreateToken`'s fields on
//! `crate::form` like the cluster forms; what a role may do is the server's decision.

use leptos::either::Either;
use leptos::prelude::*;

use super::gate::{Gate, text};
use super::{StateBadge, loading};
use crate::api::call::call;
use crate::api::tokens::{CreateToken, ListTokens, RevokeToken};
use crate::form::{Field, FieldInput, FormAlert, FormState, check, request};
use crate::session::ErrorPanel;
use crate::time::short;

#[component]
pub fn TokensPage() -> impl IntoView {
    // Bumped after each change so the list reloads.
    let changed = RwSignal::new(0u32);
    let tokens = Resource::new(
        move || changed.get(),
        |_| async move { call(&ListTokens {}).await },
    );
    // Revoking is two calls: the first answers with what will be revoked and a
    // confirmation, shown above the list; the second, with it, revokes.
    let revoking = Gate::default();
    // Whose revocation the shown plan is.
    let pending = RwSignal::new(None::<String>);
    let revoke = move |name: String| {
        if pending.get_untracked().as_ref() != Some(&name) {
            revoking.reset();
        }
        leptos::task::spawn_local(async move {
            let sent = match check::<RevokeToken>(request(&[text("name", name.clone())])) {
                Ok(r) => revoking.send(r).await,
                Err(e) => Err(e),
            };
            match sent {
                Ok(Some(_)) => {
                    pending.set(None);
                    changed.update(|n| *n += 1);
                }
                Ok(None) => pending.set(Some(name)),
                Err(e) => revoking.fail(e),
            }
        });
    };
    view! {
        <section class="page">
            <header class="page-head">
                <h1>"API tokens"</h1>
            </header>
            <CreateTokenForm changed/>
            <div class="panel">
                <h2>"Tokens"</h2>
                {move || match pending.get().filter(|_| revoking.reviewing()) {
                    Some(name) => {
                        let again = name.clone();
                        view! {
                            <div class="confirm" role="group" aria-label="Confirm revocation">
                                <p>{format!("Revoke {name}? Whoever holds it is signed out at once.")}</p>
                                {revoking.view()}
                                <button
                                    class="danger"
                                    type="button"
                                    disabled=move || revoking.busy()
                                    on:click=move |_| revoke(again.clone())
                                >
                                    "Revoke token"
                                </button>
                                <button type="button" on:click=move |_| { revoking.reset(); pending.set(None); }>"Keep it"</button>
                            </div>
                        }
                        .into_any()
                    }
                    None => revoking.view().into_any(),
                }}
                <Transition fallback=loading>
                    {move || Suspend::new(async move {
                        match tokens.await {
                            Ok(list) => {
                                Either::Left(view! {
                                    <div class="table-wrap">
                                        <table class="table tokens">
                                            <caption class="visually-hidden">"API tokens"</caption>
                                            <thead>
                                                <tr>
                                                    <th scope="col">"Name"</th>
                                                    <th scope="col">"Role"</th>
                                                    <th scope="col">"Created"</th>
                                                    <th scope="col">"Last used"</th>
                                                    <th scope="col">"State"</th>
                                                    <th scope="col"><span class="visually-hidden">"Actions"</span></th>
                                                </tr>
                                            </thead>
                                            <tbody>
                                                {list
                                                    .tokens
                                                    .into_iter()
                                                    .map(|t| {
                                                        let revoked = t.revoked_at.is_some();
                                                        let name = t.name.clone();
                                                        view! {
                                                            <tr data-token=t.name.clone()>
                                                                <th scope="row">{t.name.clone()}</th>
                                                                <td>{t.role.as_str()}</td>
                                                                <td class="time">{short(&t.created_at)}</td>
                                                                <td class="time">{t.last_used_at.as_deref().map(short).unwrap_or_else(|| "never".into())}</td>
                                                                <td>
                                                                    <StateBadge state=if revoked { "revoked" } else { "active" }.to_owned()/>
                                                                </td>
                                                                <td>
                                                                    {(!revoked).then(|| {
                                                                        let name = name.clone();
                                                                        view! {
                                                                            <button
                                                                                class="danger"
                                                                                type="button"
                                                                                aria-label=format!("Revoke {name}")
                                                                                on:click=move |_| revoke(name.clone())
                                                                            >
                                                                                "Revoke"
                                                                            </button>
                                                                        }
                                                                    })}
                                                                </td>
                                                            </tr>
                                                        }
                                                    })
                                                    .collect_view()}
                                            </tbody>
                                        </table>
                                    </div>
                                }
                                    )
                            }
                            Err(e) => Either::Right(view! { <ErrorPanel error=e/> }),
                        }
                    })}
                </Transition>
            </div>
        </section>
    }
}

const NAME: Field = Field::text("name", "Name")
    .required()
    .placeholder("ci-deployer")
    .hint("To recognise it in lists and the audit log: letters, digits, '.', '_' and '-'.");
const ROLE: Field = Field::select("role", "Role")
    .default("viewer")
    .hint("Viewers read; operators change clusters and workloads; admins also manage tokens.");
const FIELDS: &[Field] = &[NAME, ROLE];

#[component]
fn CreateTokenForm(changed: RwSignal<u32>) -> impl IntoView {
    let (form, record) = FormState::declared(FIELDS);
    let secret = RwSignal::new(None::<(String, String)>);
    let roles = Signal::stored(
        ["viewer", "operator", "admin"]
            .map(|r| (r.to_owned(), r.to_owned()))
            .to_vec(),
    );
    let submit = move |ev: leptos::ev::SubmitEvent| {
        ev.prevent_default();
        form.clear();
        secret.set(None);
        let request = match check::<CreateToken>(form.request()) {
            Ok(r) => r,
            Err(e) => return form.show(e),
        };
        form.busy.set(true);
        leptos::task::spawn_local(async move {
            let result = call(&request).await;
            form.busy.set(false);
            match result {
                Ok(created) => {
                    secret.set(Some((created.info.name, created.token)));
                    record.value("name").set(String::new());
                    changed.update(|n| *n += 1);
                }
                Err(e) => form.show(e),
            }
        });
    };
    view! {
        <form class="panel form" on:submit=submit novalidate>
            <h2>"Create a token"</h2>
            <FieldInput form record field=&NAME/>
            <FieldInput form record field=&ROLE options=roles/>
            <FormAlert form/>
            <div class="actions">
                <button class="primary" type="submit" disabled=move || form.busy.get()>"Create token"</button>
            </div>
            {move || secret.get().map(|(n, s)| view! {
                <div class="secret" role="status">
                    <p>{format!("Token {n} created. Copy its secret now: it is not shown again.")}</p>
                    <code class="secret-value">{s}</code>
                </div>
            })}
        </form>
    }
}
