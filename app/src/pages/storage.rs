//! The cluster page's Storage tab: every storage `list_storage` reads from the cluster
//! (the shared bucket first), a browser over one storage's bucket that names each file
//! by the path pods see it at, an upload of a small file into the folder shown, and the
//! forms that mount another bucket, create a Lustre file system, or unmount either. Every change goes through the gate:
//! plan first, then exactly that request. Reads are asked from the browser once the page
//! is up (an effect runs only there), so the page's first answer does not wait on the
//! cluster's API server.

use leptos::either::Either;
use leptos::prelude::*;

use super::gate::{Gate, flag, integer, text};
use super::{StateBadge, Table, loading};
use crate::api::ApiError;
use crate::api::call::call;
use crate::api::command::Role;
use crate::api::storage::{
    CheckStorage, CreateFsxStorage, CreateS3Storage, DeleteStorage, ListStorage,
    ListStorageContents, SHARED_CLAIM, StorageCheck, StorageContents, StorageDetail,
    UploadStorageFile, UploadedFile,
};
use crate::api::values::{EksClusterName, StorageName};
use crate::form::{check, request};
use crate::session::{ErrorPanel, IfRole};

#[component]
pub fn StoragePanel(
    name: String,
    /// The cluster is active or imported: only then is there storage to read.
    usable: Signal<bool>,
) -> impl IntoView {
    let cluster = StoredValue::new(name);
    let reads = RwSignal::new(0u32);
    let listed = Resource::new(
        move || reads.get(),
        move |n| async move {
            if n == 0 {
                return None;
            }
            Some(match EksClusterName::parse(&cluster.get_value()) {
                Ok(name) => call(&ListStorage { name }).await,
                Err(m) => Err(ApiError::field("name", m)),
            })
        },
    );
    Effect::new(move || {
        if usable.get() && reads.get_untracked() == 0 {
            reads.set(1);
        }
    });
    let browsing = RwSignal::new(SHARED_CLAIM.to_owned());
    let checked = RwSignal::new(None::<Result<StorageCheck, ApiError>>);
    let check = move |_| {
        leptos::task::spawn_local(async move {
            let result = match EksClusterName::parse(&cluster.get_value()) {
                Ok(name) => call(&CheckStorage { name }).await,
                Err(m) => Err(ApiError::field("name", m)),
            };
            checked.set(Some(result));
        });
    };
    let refresh = move |_| reads.update(|n| *n += 1);
    let shown = move || {
        Suspend::new(async move {
            match listed.await {
                None => Either::Left(view! {
                    <p class="muted">"Read from the cluster once it is active."</p>
                }),
                Some(Ok(list)) => Either::Right(Either::Left(view! {
                    <StorageTable cluster=cluster.get_value() storage=list.storage browsing/>
                })),
                Some(Err(error)) => Either::Right(Either::Right(view! { <ErrorPanel error/> })),
            }
        })
    };
    view! {
        <div class="panel storage" aria-labelledby="storage-title">
            <h2 id="storage-title">"Storage"</h2>
            <p class="hint">
                "What is at s3://bucket/key is at <mount path>/key in every pod that mounts the storage."
            </p>
            <Transition fallback=loading>{shown}</Transition>
            <div class="actions">
                <button type="button" class="refresh-storage" on:click=refresh>"Refresh"</button>
                <button type="button" class="check-storage" on:click=check>"Check mounts"</button>
            </div>
            {move || checked.get().map(|c| match c {
                Ok(c) => Either::Left(view! { <Checked c/> }),
                Err(error) => Either::Right(view! { <ErrorPanel error/> }),
            })}
        </div>
        {move || {
            let storage = browsing.get();
            view! { <Browser cluster=cluster.get_value() storage usable/> }
        }}
        <IfRole role=Role::Operator>
            <AddStorage cluster=cluster.get_value()/>
            <AddFileSystem cluster=cluster.get_value()/>
        </IfRole>
    }
    .into_any()
}

#[component]
fn StorageTable(
    cluster: String,
    storage: Vec<StorageDetail>,
    browsing: RwSignal<String>,
) -> impl IntoView {
    let rows = storage
        .into_iter()
        .map(|s| {
            let name = s.name.clone();
            let used = match s.used_by.len() {
                0 => "—".to_owned(),
                _ => s
                    .used_by
                    .iter()
                    .map(|u| u.owner.clone().unwrap_or_else(|| format!("Pod/{}", u.pod)))
                    .collect::<Vec<_>>()
                    .join(", "),
            };
            let browse = {
                let name = name.clone();
                move |_| browsing.set(name.clone())
            };
            let delete = (!s.shared).then(|| {
                let (cluster, name) = (cluster.clone(), name.clone());
                view! {
                    <IfRole role=Role::Operator>
                        <DeleteButton cluster=cluster.clone() storage=name.clone()/>
                    </IfRole>
                }
            });
            view! {
                <tr data-storage=name.clone()>
                    <th scope="row" class="mono">{name.clone()}</th>
                    <td>{s.kind}{s.shared.then_some(" (shared)")}</td>
                    <td class="mono">{s.bucket.clone().or(s.file_system).unwrap_or_else(|| "—".into())}</td>
                    <td class="mono">{s.mount_path}</td>
                    <td><StateBadge state=s.phase/></td>
                    <td class="used-by">{used}</td>
                    <td class="row-actions">
                        {s.bucket.is_some().then(|| view! {
                            <button type="button" class="browse-storage" on:click=browse>"Browse"</button>
                        })}
                        {delete}
                    </td>
                </tr>
            }
        })
        .collect_view();
    view! {
        <Table
            class="storage-table"
            caption="Storage"
            columns={&["Name", "Kind", "Bucket or file system", "Mount path", "Phase", "Used by", ""]}
        >
            {rows}
        </Table>
    }
}

/// What `check_storage` found: each finding with the command that fixes it.
#[component]
fn Checked(c: StorageCheck) -> impl IntoView {
    let count = c.checked.len();
    if c.findings.is_empty() {
        return Either::Left(view! {
            <p class="check-result ok" role="status">{format!("Every storage can be mounted ({count} checks).")}</p>
        });
    }
    let findings = c
        .findings
        .into_iter()
        .map(|f| {
            view! {
                <li class=format!("finding {}", f.severity) data-check=f.check.clone()>
                    <span class=format!("badge state state-{}", f.severity)>{f.severity.clone()}</span>
                    " "
                    {f.storage.map(|s| format!("{s}: "))}
                    {f.message}
                    {f.fix.map(|fix| view! { <pre class="fix"><code>{fix}</code></pre> })}
                </li>
            }
        })
        .collect_view();
    Either::Right(view! { <ul class="check-result findings" role="status">{findings}</ul> })
}

/// Unmounts a storage: the first click shows the plan and asks for the confirmation, the
/// second runs it; refused with the pods' names while any mounts it.
#[component]
fn DeleteButton(cluster: String, storage: String) -> impl IntoView {
    let gate = Gate::default();
    let named = StoredValue::new([text("name", cluster), text("storage", storage)]);
    let delete = move |_| gate.start::<DeleteStorage>(&named.get_value());
    view! {
        <button type="button" class="danger delete-storage" disabled=move || gate.busy() on:click=delete>
            {move || if gate.reviewing() { "Unmount" } else { "Delete" }}
        </button>
        {move || gate.reviewing().then(|| view! {
            <button type="button" class="keep-storage" on:click=move |_| gate.reset()>"Keep it"</button>
        })}
        {gate.view()}
    }
}

/// One storage's folders and files under the folder shown, a page at a time, and the
/// upload into that folder.
#[component]
fn Browser(cluster: String, storage: String, usable: Signal<bool>) -> impl IntoView {
    let cluster = StoredValue::new(cluster);
    let storage = StoredValue::new(storage);
    let prefix = RwSignal::new(String::new());
    let page = RwSignal::new(None::<String>);
    let reads = RwSignal::new(0u32);
    let contents = Resource::new(
        move || (reads.get(), prefix.get(), page.get()),
        move |(n, prefix, page_token)| async move {
            if n == 0 {
                return None;
            }
            let request = match (
                EksClusterName::parse(&cluster.get_value()),
                StorageName::parse(&storage.get_value()),
            ) {
                (Ok(name), Ok(storage)) => ListStorageContents {
                    name,
                    storage,
                    prefix,
                    page_token,
                    limit: None,
                },
                (Err(m), _) => return Some(Err(ApiError::field("name", m))),
                (_, Err(m)) => return Some(Err(ApiError::field("storage", m))),
            };
            Some(call(&request).await)
        },
    );
    Effect::new(move || {
        if usable.get() && reads.get_untracked() == 0 {
            reads.set(1);
        }
    });
    let open = Callback::new(move |folder: String| {
        page.set(None);
        prefix.set(folder);
    });
    let reload = Callback::new(move |()| reads.update(|n| *n += 1));
    let shown = move || {
        Suspend::new(async move {
            match contents.await {
                None => {
                    Either::Left(view! { <p class="muted">"Read once the cluster is active."</p> })
                }
                Some(Ok(c)) => Either::Right(Either::Left(view! { <Contents c open page/> })),
                Some(Err(error)) => Either::Right(Either::Right(view! { <ErrorPanel error/> })),
            }
        })
    };
    view! {
        <div class="panel storage-browser" aria-labelledby="browser-title" data-storage=storage.get_value()>
            <h2 id="browser-title">{format!("Files of {}", storage.get_value())}</h2>
            <Transition fallback=loading>{shown}</Transition>
            <IfRole role=Role::Operator>
                <Upload cluster=cluster.get_value() storage=storage.get_value() prefix reload/>
            </IfRole>
        </div>
    }
    .into_any()
}

#[component]
fn Contents(
    c: StorageContents,
    open: Callback<String>,
    page: RwSignal<Option<String>>,
) -> impl IntoView {
    let parent = (!c.prefix.is_empty()).then(|| {
        let trimmed = c.prefix.trim_end_matches('/');
        let up = trimmed.rfind('/').map_or(String::new(), |i| trimmed[..=i].to_owned());
        view! {
            <li><button type="button" class="plain folder-up" on:click=move |_| open.run(up.clone())>".."</button></li>
        }
    });
    let folders = c
        .folders
        .into_iter()
        .map(|f| {
            let label = f[c.prefix.len()..].to_owned();
            view! {
                <li><button type="button" class="plain folder" data-folder=f.clone() on:click=move |_| open.run(f.clone())>{label}</button></li>
            }
        })
        .collect_view();
    let empty = c.files.is_empty();
    let files = c
        .files
        .into_iter()
        .map(|f| {
            view! {
                <tr data-key=f.key.clone()>
                    <th scope="row" class="mono">{f.key[c.prefix.len()..].to_owned()}</th>
                    <td class="num">{size(f.size_bytes)}</td>
                    <td>{f.last_modified.as_deref().map(crate::time::short).unwrap_or_default()}</td>
                    <td class="mono">{f.path_in_pods}</td>
                </tr>
            }
        })
        .collect_view();
    let next = c.next_page_token.map(|token| {
        view! {
            <button type="button" class="next-page" on:click=move |_| page.set(Some(token.clone()))>"Next page"</button>
        }
    });
    view! {
        <p class="mono where">
            {format!("s3://{}/{}", c.bucket, c.prefix)}" → "<strong class="in-pods">{c.mount_path}</strong>
        </p>
        <ul class="folders">{parent}{folders}</ul>
        {(!empty).then(|| view! {
            <Table class="files" caption="Files" columns={&["File", "Size", "Modified", "Path in pods"]}>
                {files}
            </Table>
        })}
        {next}
    }
}

/// Bytes as people read them (1,024 per step).
pub(crate) fn size(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// Puts a small file into the folder shown: its key starts as the folder and the file's
/// name, the plan comes first, and a file already there is written over only when asked.
#[component]
fn Upload(
    cluster: String,
    storage: String,
    prefix: RwSignal<String>,
    reload: Callback<()>,
) -> impl IntoView {
    let gate = Gate::default();
    let named = StoredValue::new((cluster, storage));
    let key = RwSignal::new(String::new());
    let replace = RwSignal::new(false);
    let uploaded = RwSignal::new(None::<UploadedFile>);
    let file_input = NodeRef::<leptos::html::Input>::new();
    // A new folder, a new file: what was reviewed no longer holds.
    Effect::new(move || {
        let _ = prefix.get();
        gate.reset();
    });
    let chosen = move |_| {
        gate.reset();
        if let Some(name) = picked_name(file_input) {
            key.set(format!("{}{name}", prefix.get_untracked()));
        }
    };
    let send = move |ev: leptos::ev::SubmitEvent| {
        ev.prevent_default();
        uploaded.set(None);
        let (cluster, storage) = named.get_value();
        let key = key.get_untracked();
        let replace = replace.get_untracked();
        leptos::task::spawn_local(async move {
            let content = match read_base64(file_input).await {
                Ok(c) => c,
                Err(e) => return gate.fail(e),
            };
            let inputs = [
                text("name", cluster),
                text("storage", storage),
                text("key", key),
                text("content_base64", content),
                flag("replace", replace),
            ];
            let sent = match check::<UploadStorageFile>(request(&inputs)) {
                Ok(r) => gate.send(r).await,
                Err(e) => Err(e),
            };
            match sent {
                Ok(Some(done)) => {
                    uploaded.set(Some(done));
                    reload.run(());
                }
                Ok(None) => {}
                Err(e) => gate.fail(e),
            }
        });
    };
    view! {
        <form class="upload" aria-label="Upload a file" on:submit=send>
            <h3>"Upload a file"</h3>
            <label>"File "<input type="file" name="file" node_ref=file_input on:change=chosen/></label>
            <label>"Key "<input type="text" name="key" class="mono"
                prop:value=move || key.get()
                on:input=move |ev| { key.set(event_target_value(&ev)); gate.reset(); }/></label>
            <label class="check"><input type="checkbox" name="replace"
                prop:checked=move || replace.get()
                on:change=move |ev| { replace.set(event_target_checked(&ev)); gate.reset(); }/>
                " Replace a file already there"</label>
            <div class="actions">
                <button class="primary" type="submit" disabled=move || gate.busy()>
                    {move || if gate.reviewing() { "Upload" } else { "Review upload" }}
                </button>
            </div>
            {gate.view()}
            {move || uploaded.get().map(|u| view! {
                <p class="done" role="status">{format!("Uploaded {} bytes: {} in pods", u.size_bytes, u.path_in_pods)}</p>
            })}
        </form>
    }
}

/// The name of the file chosen, if one is.
fn picked_name(input: NodeRef<leptos::html::Input>) -> Option<String> {
    #[cfg(feature = "hydrate")]
    {
        input.get_untracked()?.files()?.get(0).map(|f| f.name())
    }
    #[cfg(not(feature = "hydrate"))]
    {
        let _ = input;
        None
    }
}

/// The chosen file's bytes, base64 as the command takes them.
async fn read_base64(input: NodeRef<leptos::html::Input>) -> Result<String, ApiError> {
    #[cfg(feature = "hydrate")]
    {
        use base64::Engine;
        let none = || ApiError::field("content_base64", "choose a file to upload");
        let file = input
            .get_untracked()
            .and_then(|i| i.files())
            .and_then(|f| f.get(0))
            .ok_or_else(none)?;
        let buffer = wasm_bindgen_futures::JsFuture::from(file.array_buffer())
            .await
            .map_err(|_| ApiError::field("content_base64", "the file could not be read"))?;
        let bytes = js_sys::Uint8Array::new(&buffer).to_vec();
        Ok(base64::engine::general_purpose::STANDARD.encode(bytes))
    }
    #[cfg(not(feature = "hydrate"))]
    {
        let _ = input;
        Err(ApiError::internal("files are read in the browser"))
    }
}

/// Mounts another bucket: a name, an existing bucket or none (hypd makes one), where
/// pods see it.
#[component]
fn AddStorage(cluster: String) -> impl IntoView {
    let gate = Gate::default();
    let cluster = StoredValue::new(cluster);
    let storage = RwSignal::new(String::new());
    let bucket = RwSignal::new(String::new());
    let mount = RwSignal::new(String::new());
    let submit = move |ev: leptos::ev::SubmitEvent| {
        ev.prevent_default();
        gate.start::<CreateS3Storage>(&[
            text("name", cluster.get_value()),
            text("storage", storage.get_untracked()),
            // Empty: hypd makes a bucket, and mounts it at /mnt/<storage>.
            text("bucket", bucket.get_untracked()),
            text("mount_path", mount.get_untracked()),
        ]);
    };
    view! {
        <form class="panel add-storage" aria-label="Mount a bucket" on:submit=submit>
            <h2>"Mount a bucket"</h2>
            <label>"Name "<input type="text" name="storage" placeholder="datasets"
                prop:value=move || storage.get() on:input=gate.edit(storage)/></label>
            <label>"Bucket "<input type="text" name="bucket" placeholder="(hypd creates one)"
                prop:value=move || bucket.get() on:input=gate.edit(bucket)/></label>
            <label>"Mount path "<input type="text" name="mount_path" placeholder="/mnt/<name>"
                prop:value=move || mount.get() on:input=gate.edit(mount)/></label>
            <div class="actions">
                <button class="primary" type="submit" disabled=move || gate.busy()>
                    {move || if gate.reviewing() { "Mount" } else { "Review plan" }}
                </button>
            </div>
            {gate.view()}
        </form>
    }
    .into_any()
}

/// Creates an FSx for Lustre file system and mounts it: a name, the deployment type,
/// its size and throughput, EFA, a directory linked to the shared bucket, where pods see
/// it. The rules (sizes, throughputs) are the request's, shown beside the form.
#[component]
fn AddFileSystem(cluster: String) -> impl IntoView {
    let gate = Gate::default();
    let cluster = StoredValue::new(cluster);
    let storage = RwSignal::new(String::new());
    let deployment = RwSignal::new("persistent_2".to_owned());
    let capacity = RwSignal::new("1200".to_owned());
    let throughput = RwSignal::new("250".to_owned());
    let efa = RwSignal::new(false);
    let linked = RwSignal::new(String::new());
    let mount = RwSignal::new(String::new());
    let submit = move |ev: leptos::ev::SubmitEvent| {
        ev.prevent_default();
        let persistent = deployment.get_untracked() == "persistent_2";
        gate.start::<CreateFsxStorage>(&[
            text("name", cluster.get_value()),
            text("storage", storage.get_untracked()),
            text("deployment_type", deployment.get_untracked()),
            integer("capacity_gib", capacity.get_untracked()),
            // Scratch's throughput is fixed: none is sent.
            integer(
                "throughput_per_tib",
                if persistent {
                    throughput.get_untracked()
                } else {
                    String::new()
                },
            ),
            flag("efa", efa.get_untracked()),
            // Empty: no directory is linked.
            text(
                "data_repositories[0].file_system_path",
                linked.get_untracked(),
            ),
            text("mount_path", mount.get_untracked()),
        ]);
    };
    view! {
        <form class="panel add-file-system" aria-label="Create a Lustre file system" on:submit=submit>
            <h2>"Create a Lustre file system"</h2>
            <label>"Name "<input type="text" name="storage" placeholder="scratch"
                prop:value=move || storage.get() on:input=gate.edit(storage)/></label>
            <label>"Deployment "
                <select name="deployment_type" on:change=gate.edit(deployment) prop:value=move || deployment.get()>
                    <option value="persistent_2">"Persistent 2"</option>
                    <option value="scratch_2">"Scratch 2"</option>
                </select>
            </label>
            <label>"Capacity (GiB) "<input type="text" inputmode="numeric" name="capacity_gib"
                prop:value=move || capacity.get() on:input=gate.edit(capacity)/></label>
            <label>"Throughput (MB/s per TiB) "
                <select name="throughput_per_tib" on:change=gate.edit(throughput) prop:value=move || throughput.get()
                    disabled=move || deployment.get() != "persistent_2">
                    <option value="125">"125"</option>
                    <option value="250">"250"</option>
                    <option value="500">"500"</option>
                    <option value="1000">"1000"</option>
                </select>
            </label>
            <label><input type="checkbox" name="efa" prop:checked=move || efa.get()
                on:change=move |ev| { efa.set(event_target_checked(&ev)); gate.reset(); }/>" EFA"</label>
            <label>"Link the shared bucket at "<input type="text" name="data_repositories[0].file_system_path"
                placeholder="(no link) e.g. /shared"
                prop:value=move || linked.get() on:input=gate.edit(linked)/></label>
            <label>"Mount path "<input type="text" name="mount_path" placeholder="/mnt/<name>"
                prop:value=move || mount.get() on:input=gate.edit(mount)/></label>
            <div class="actions">
                <button class="primary" type="submit" disabled=move || gate.busy()>
                    {move || if gate.reviewing() { "Create" } else { "Review plan" }}
                </button>
            </div>
            {gate.view()}
        </form>
    }
    .into_any()
}

#[cfg(test)]
mod tests {
    #[test]
    fn sizes_read_as_people_read_them() {
        assert_eq!(super::size(12), "12 B");
        assert_eq!(super::size(2048), "2.0 KiB");
        assert_eq!(super::size(5 * 1024 * 1024 + 1), "5.0 MiB");
    }
}
