//! The console shell (document, top bar, navigation, theme, routes) and its not-found
//! page. The shell is the same markup on the server and in the browser: hydration fails
//! on any difference, so nothing here reads a browser-only value while rendering.

use leptos::prelude::*;
use leptos_meta::{MetaTags, Stylesheet, Title, provide_meta_context};
use leptos_router::components::{A, Route, Router, Routes};
use leptos_router::{Lazy, SsrMode, path};
use serde::{Deserialize, Serialize};

use crate::api::call::call;
use crate::api::inspect::{Whoami, WhoamiOutput};
use crate::api::{ApiError, Role};
use crate::live::{self, LinkIndicator, Live};
use crate::{pages, session};

/// What the server tells every page about itself. The server provides it as context to
/// each render; pages read it through [`get_console_info`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConsoleInfo {
    pub version: String,
    /// True when hypd talks to the local test world (moto + sim) instead of AWS.
    pub sandbox: bool,
    pub region: Option<String>,
}

#[server(prefix = "/fn")]
pub async fn get_console_info() -> Result<ConsoleInfo, ServerFnError> {
    use_context::<ConsoleInfo>().ok_or_else(|| ServerFnError::new("console context is not set"))
}

/// The HTML document around the app, rendered on the server only.
pub fn shell(options: LeptosOptions) -> impl IntoView {
    view! {
        <!DOCTYPE html>
        <html lang="en">
            <head>
                <meta charset="utf-8"/>
                <meta name="viewport" content="width=device-width, initial-scale=1"/>
                <meta name="color-scheme" content="light dark"/>
                <link rel="icon" type="image/svg+xml" href=ICON.as_str()/>
                <AutoReload options=options.clone()/>
                <HydrationScripts options/>
                <MetaTags/>
            </head>
            <body>
                <App/>
            </body>
        </html>
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Theme {
    /// Follow the operating system (`prefers-color-scheme`).
    System,
    Light,
    Dark,
}

impl Theme {
    fn attr(self) -> &'static str {
        match self {
            Theme::System => "system",
            Theme::Light => "light",
            Theme::Dark => "dark",
        }
    }

    fn next(self) -> Self {
        match self {
            Theme::System => Theme::Light,
            Theme::Light => Theme::Dark,
            Theme::Dark => Theme::System,
        }
    }

    fn label(self) -> &'static str {
        match self {
            Theme::System => "Theme: system",
            Theme::Light => "Theme: light",
            Theme::Dark => "Theme: dark",
        }
    }
}

/// Who is signed in, as the server's dispatch sees the session (`whoami`); every page
/// reads it from context to choose what to offer.
pub type Me = Resource<Result<WhoamiOutput, ApiError>>;

#[component]
pub fn App() -> impl IntoView {
    provide_meta_context();
    let theme = RwSignal::new(Theme::System);
    let me: Me = Resource::new(|| (), |_| call(&Whoami {}));
    provide_context(me);
    // A render without the server's context (its not-found page) cannot tell who is
    // signed in: the browser asks again once the page has hydrated.
    live::after_hydration(move || {
        if matches!(me.get_untracked(), Some(Err(e)) if !matches!(e, ApiError::Unauthorized { .. }))
        {
            me.refetch();
        }
    });
    let live = Live::new();
    provide_context(live);
    // The live channel needs a session: open it once someone is signed in.
    let started = StoredValue::new(false);
    Effect::new(move || {
        if matches!(me.get(), Some(Ok(_))) && !started.get_value() {
            started.set_value(true);
            live::start(live);
        }
    });

    view! {
        <Stylesheet id="leptos" href="/pkg/hypd.css"/>
        <Title text="hypd console"/>
        <div
            class="console"
            data-theme=move || theme.get().attr()
        >
            <Router>
                <a class="skip-link" href="#main">"Skip to content"</a>
                <header class="topbar">
                    <a class="brand" href="/">"hypd"</a>
                    <nav class="nav" aria-label="Main">
                        <A href="/clusters">"Clusters"</A>
                        <A href="/endpoints">"Endpoints"</A>
                        <A href="/operations">"Operations"</A>
                        <session::IfRole role=Role::Admin>
                            <A href="/tokens">"Tokens"</A>
                        </session::IfRole>
                    </nav>
                    <span class="spacer"></span>
                    <LinkIndicator/>
                    <session::UserMenu/>
                    <button
                        class="theme-toggle"
                        type="button"
                        aria-label="Switch colour theme"
                        on:click=move |_| theme.update(|t| *t = t.next())
                    >
                        {move || theme.get().label()}
                    </button>
                </header>
                <SandboxBanner/>
                <main class="content" id="main">
                    <Routes fallback=|| view! { <NotFound/> }>
                        // Rendered whole before answering, so an unsigned visitor gets a redirect.
                        <Route path=path!("/") view={Lazy::<pages::OverviewRoute>::new()} ssr=SsrMode::Async/>
                        <Route path=path!("/login") view={Lazy::<pages::SignInRoute>::new()}/>
                        <Route path=path!("/clusters") view={Lazy::<pages::ClusterListRoute>::new()}/>
                        <Route path=path!("/clusters/import") view={Lazy::<pages::ImportClusterRoute>::new()}/>
                        <Route path=path!("/clusters/new") view={Lazy::<pages::CreateClusterRoute>::new()}/>
                        // A cluster's page is in tabs, each its own address and code.
                        <Route path=path!("/clusters/:name") view={Lazy::<pages::ClusterOverviewRoute>::new()}/>
                        <Route path=path!("/clusters/:name/nodes") view={Lazy::<pages::ClusterNodesRoute>::new()}/>
                        <Route path=path!("/clusters/:name/features") view={Lazy::<pages::ClusterFeaturesRoute>::new()}/>
                        <Route path=path!("/clusters/:name/storage") view={Lazy::<pages::ClusterStorageRoute>::new()}/>
                        <Route path=path!("/clusters/:name/models") view={Lazy::<pages::ClusterModelsRoute>::new()}/>
                        <Route path=path!("/clusters/:name/training") view={Lazy::<pages::ClusterTrainingRoute>::new()}/>
                        <Route path=path!("/clusters/:name/inference") view={Lazy::<pages::ClusterInferenceRoute>::new()}/>
                        <Route path=path!("/clusters/:name/drift") view={Lazy::<pages::ClusterDriftRoute>::new()}/>
                        <Route path=path!("/clusters/:name/operations") view={Lazy::<pages::ClusterOperationsRoute>::new()}/>
                        <Route path=path!("/endpoints") view={Lazy::<pages::EndpointsRoute>::new()}/>
                        <Route path=path!("/operations") view={Lazy::<pages::OperationListRoute>::new()}/>
                        <Route path=path!("/tokens") view={Lazy::<pages::TokensRoute>::new()}/>
                        <Route
                            path=path!("/operations/:id")
                            view={Lazy::<pages::OperationRoute>::new()}
                        />
                    </Routes>
                </main>
            </Router>
        </div>
    }
}

#[component]
fn SandboxBanner() -> impl IntoView {
    let info = Resource::new(|| (), |_| get_console_info());
    live::after_hydration(move || {
        if matches!(info.get_untracked(), Some(Err(_))) {
            info.refetch();
        }
    });
    view! {
        <Suspense fallback=|| ()>
            {move || Suspend::new(async move {
                match info.await {
                    Ok(info) if info.sandbox => {
                        Some(
                            view! {
                                <div class="sandbox-banner" role="status">
                                    "Sandbox: this console talks to a local test world (moto + sim), not to AWS. Nothing you create here costs money or exists in an account."
                                </div>
                            },
                        )
                    }
                    _ => None,
                }
            })}
        </Suspense>
    }
}

#[component]
fn NotFound() -> impl IntoView {
    view! {
        <section class="panel">
            <h1>"Not found"</h1>
            <p>"There is no page at this address. " <a href="/">"Back to the console"</a></p>
        </section>
    }
}

/// The console's icon (public/favicon.svg) as a data URL: through a tunnel a linked icon
/// costs a round trip on every cold page, and Chromium asks for it again after each
/// navigation inside the console. Made once, not per page rendered.
static ICON: std::sync::LazyLock<String> = std::sync::LazyLock::new(icon_href);

fn icon_href() -> String {
    let svg = include_str!("../../public/favicon.svg").trim();
    let mut href = String::from("data:image/svg+xml,");
    for c in svg.chars() {
        match c {
            '#' => href.push_str("%23"),
            '%' => href.push_str("%25"),
            '<' => href.push_str("%3C"),
            '>' => href.push_str("%3E"),
            '"' => href.push('\''),
            _ => href.push(c),
        }
    }
    href
}
