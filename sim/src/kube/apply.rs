//! Patches and field ownership: JSON merge patch (RFC 7386), strategic merge patch as
//! kubectl sends it for built-in kinds, and server-side apply with `managedFields`.
//! Field sets track object fields down to the leaves; lists are owned as a whole
//! (atomic), which is coarser than Kubernetes' associative lists but gives the same
//! answers for the workloads hypd applies: one manager per list.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value, json};

/// JSON merge patch: objects merge, `null` deletes, everything else replaces.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    let Some(p) = patch.as_object() else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    if let Some(t) = target.as_object_mut() {
        for (k, v) in p {
            if v.is_null() {
                t.remove(k);
            } else {
                merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
    }
}

/// Strategic merge patch, as far as kubectl's patches for built-in kinds need it: lists
/// of objects that carry `name` (containers, env, ports, volumes) merge by name
/// (`$patch: delete` removes an element), other lists replace, `$`-directives that only
/// steer ordering are ignored.
pub fn strategic_merge_patch(target: &mut Value, patch: &Value) {
    let Some(p) = patch.as_object() else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let Some(t) = target.as_object_mut() else {
        return;
    };
    for (k, v) in p {
        if k.starts_with('$') {
            if k.starts_with("$deleteFromPrimitiveList/")
                && let (Some(field), Some(gone)) = (k.split('/').nth(1), v.as_array())
                && let Some(list) = t.get_mut(field).and_then(Value::as_array_mut)
            {
                list.retain(|x| !gone.contains(x));
            }
            continue;
        }
        match v {
            Value::Null => {
                t.remove(k);
            }
            Value::Array(items) if is_named_list(items) => {
                let existing = t.entry(k.clone()).or_insert_with(|| json!([]));
                if !existing.is_array() {
                    *existing = json!([]);
                }
                if let Some(list) = existing.as_array_mut() {
                    for item in items {
                        let name = &item["name"];
                        let delete = item["$patch"].as_str() == Some("delete");
                        match list.iter().position(|x| &x["name"] == name) {
                            Some(i) if delete => {
                                list.remove(i);
                            }
                            Some(i) => strategic_merge_patch(&mut list[i], item),
                            None if delete => {}
                            None => {
                                let mut fresh = json!({});
                                strategic_merge_patch(&mut fresh, item);
                                list.push(fresh);
                            }
                        }
                    }
                }
            }
            _ => strategic_merge_patch(t.entry(k.clone()).or_insert(Value::Null), v),
        }
    }
}

fn is_named_list(items: &[Value]) -> bool {
    !items.is_empty()
        && items
            .iter()
            .all(|i| i.get("name").is_some_and(Value::is_string))
}

/// A field: the keys from the object's root.
pub type Path = Vec<String>;

/// Fields never owned: identity and bookkeeping the server maintains.
fn ignored(path: &[String], status_subresource: bool) -> bool {
    match path {
        [k] if k == "apiVersion" || k == "kind" => true,
        [m, k] if m == "metadata" => [
            "name",
            "namespace",
            "resourceVersion",
            "uid",
            "creationTimestamp",
            "managedFields",
            "generation",
            "deletionTimestamp",
            "selfLink",
        ]
        .contains(&k.as_str()),
        [s, ..] if s == "status" => status_subresource,
        _ => false,
    }
}

/// The leaf fields of an object: scalars, lists, and empty objects.
pub fn leaves(v: &Value, status_subresource: bool) -> BTreeSet<Path> {
    let mut out = BTreeSet::new();
    fn walk(v: &Value, path: &mut Path, out: &mut BTreeSet<Path>, status: bool) {
        match v.as_object() {
            Some(o) if !o.is_empty() => {
                for (k, child) in o {
                    path.push(k.clone());
                    if !ignored(path, status) {
                        walk(child, path, out, status);
                    }
                    path.pop();
                }
            }
            _ => {
                if !path.is_empty() {
                    out.insert(path.clone());
                }
            }
        }
    }
    walk(v, &mut Vec::new(), &mut out, status_subresource);
    out
}

pub fn get_path<'a>(v: &'a Value, path: &[String]) -> Option<&'a Value> {
    path.iter().try_fold(v, |v, k| v.get(k))
}

fn set_path(v: &mut Value, path: &[String], value: Value) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let mut cur = v;
    for k in parents {
        if !cur.get(k).is_some_and(Value::is_object) {
            cur[k.as_str()] = json!({});
        }
        cur = &mut cur[k.as_str()];
    }
    cur[last.as_str()] = value;
}

fn remove_path(v: &mut Value, path: &[String]) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let mut cur = v;
    for k in parents {
        match cur.get_mut(k) {
            Some(next) => cur = next,
            None => return,
        }
    }
    if let Some(o) = cur.as_object_mut() {
        o.remove(last);
    }
}

/// `managedFields`' `fieldsV1` encoding of a field set.
pub fn fields_v1(set: &BTreeSet<Path>) -> Value {
    let mut root = json!({});
    for path in set {
        let mut cur = &mut root;
        for k in path {
            let key = format!("f:{k}");
            if cur.get(&key).is_none() {
                cur[key.as_str()] = json!({});
            }
            cur = &mut cur[key.as_str()];
        }
    }
    root
}

/// The inverse of [`fields_v1`]: a `{}` with no `f:` children is a leaf.
pub fn parse_fields_v1(v: &Value) -> BTreeSet<Path> {
    let mut out = BTreeSet::new();
    fn walk(v: &Value, path: &mut Path, out: &mut BTreeSet<Path>) {
        let children: Vec<(&String, &Value)> = v
            .as_object()
            .map(|o| o.iter().filter(|(k, _)| k.starts_with("f:")).collect())
            .unwrap_or_default();
        if children.is_empty() {
            if !path.is_empty() {
                out.insert(path.clone());
            }
            return;
        }
        for (k, child) in children {
            path.push(k[2..].to_owned());
            walk(child, path, out);
            path.pop();
        }
    }
    walk(v, &mut Vec::new(), &mut out);
    out
}

/// One `managedFields` entry.
#[derive(Clone, Debug, PartialEq)]
pub struct Managed {
    pub manager: String,
    pub operation: String,
    pub api_version: String,
    pub time: String,
    pub fields: BTreeSet<Path>,
    pub subresource: Option<String>,
}

impl Managed {
    /// The entry a server-side apply by `manager` leaves: it owns exactly what it applied.
    fn apply(manager: &str, api_version: String, now: &str, fields: BTreeSet<Path>) -> Self {
        Self {
            manager: manager.to_owned(),
            operation: "Apply".into(),
            api_version,
            time: now.to_owned(),
            fields,
            subresource: None,
        }
    }
}

pub fn read_managed(obj: &Value) -> Vec<Managed> {
    obj["metadata"]["managedFields"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| {
            Some(Managed {
                manager: m["manager"].as_str()?.to_owned(),
                operation: m["operation"].as_str().unwrap_or("Update").to_owned(),
                api_version: m["apiVersion"].as_str().unwrap_or_default().to_owned(),
                time: m["time"].as_str().unwrap_or_default().to_owned(),
                fields: parse_fields_v1(&m["fieldsV1"]),
                subresource: m["subresource"].as_str().map(str::to_owned),
            })
        })
        .collect()
}

pub fn write_managed(obj: &mut Value, managed: &[Managed]) {
    let entries: Vec<Value> = managed
        .iter()
        .filter(|m| !m.fields.is_empty())
        .map(|m| {
            let mut e = json!({
                "manager": m.manager,
                "operation": m.operation,
                "apiVersion": m.api_version,
                "time": m.time,
                "fieldsType": "FieldsV1",
                "fieldsV1": fields_v1(&m.fields),
            });
            if let Some(s) = &m.subresource {
                e["subresource"] = json!(s);
            }
            e
        })
        .collect();
    if let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        if entries.is_empty() {
            meta.remove("managedFields");
        } else {
            meta.insert("managedFields".into(), Value::Array(entries));
        }
    }
}

/// Ownership after a non-apply write by `manager`: it takes every field it changed or
/// added; fields that disappeared are owned by nobody.
pub fn record_update(
    old: Option<&Value>,
    new: &mut Value,
    manager: &str,
    api_version: &str,
    now: &str,
    status_subresource: bool,
    subresource: Option<&str>,
) {
    let mut managed = old.map(read_managed).unwrap_or_default();
    let new_leaves = leaves(new, status_subresource && subresource.is_none());
    let changed: BTreeSet<Path> = new_leaves
        .iter()
        .filter(|p| old.and_then(|o| get_path(o, p)) != get_path(new, p))
        .cloned()
        .collect();
    for m in &mut managed {
        m.fields
            .retain(|p| new_leaves.contains(p) && !changed.contains(p));
    }
    if !changed.is_empty() {
        let sub = subresource.map(str::to_owned);
        match managed
            .iter_mut()
            .find(|m| m.manager == manager && m.operation == "Update" && m.subresource == sub)
        {
            Some(m) => {
                m.fields.extend(changed);
                m.time = now.to_owned();
            }
            None => managed.push(Managed {
                manager: manager.to_owned(),
                operation: "Update".into(),
                api_version: api_version.to_owned(),
                time: now.to_owned(),
                fields: changed,
                subresource: sub,
            }),
        }
    }
    write_managed(new, &managed);
}

#[derive(Debug, PartialEq)]
pub struct Conflict {
    pub manager: String,
    pub field: String,
}

pub fn field_name(p: &[String]) -> String {
    format!(".{}", p.join("."))
}

/// Server-side apply of `applied` by `manager` onto `current` (None: create). Returns the
/// new object with its managedFields, or the conflicts with other managers.
pub fn server_side_apply(
    current: Option<&Value>,
    applied: &Value,
    manager: &str,
    force: bool,
    now: &str,
    status_subresource: bool,
) -> Result<Value, Vec<Conflict>> {
    let api_version = applied["apiVersion"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let applied_set = leaves(applied, status_subresource);
    let Some(current) = current else {
        let mut obj = applied.clone();
        if status_subresource && let Some(o) = obj.as_object_mut() {
            o.remove("status");
        }
        write_managed(
            &mut obj,
            &[Managed::apply(manager, api_version, now, applied_set)],
        );
        return Ok(obj);
    };
    let mut managed = read_managed(current);
    let mut conflicts = Vec::new();
    for m in managed
        .iter()
        .filter(|m| m.manager != manager || m.operation != "Apply")
    {
        if m.manager == manager && m.operation == "Update" {
            // A manager's own earlier updates never conflict with its applies.
            continue;
        }
        for p in m.fields.intersection(&applied_set) {
            if get_path(current, p) != get_path(applied, p) {
                conflicts.push(Conflict {
                    manager: m.manager.clone(),
                    field: field_name(p),
                });
            }
        }
    }
    if !conflicts.is_empty() && !force {
        return Err(conflicts);
    }
    let previous: BTreeSet<Path> = managed
        .iter()
        .find(|m| m.manager == manager && m.operation == "Apply" && m.subresource.is_none())
        .map(|m| m.fields.clone())
        .unwrap_or_default();
    for m in managed
        .iter_mut()
        .filter(|m| !(m.manager == manager && m.operation == "Apply"))
    {
        if force || m.manager == manager {
            m.fields.retain(|p| !applied_set.contains(p));
        }
    }
    let others: BTreeSet<&Path> = managed
        .iter()
        .filter(|m| !(m.manager == manager && m.operation == "Apply"))
        .flat_map(|m| m.fields.iter())
        .collect();
    let mut obj = current.clone();
    for p in previous.difference(&applied_set) {
        if !others.contains(p) {
            remove_path(&mut obj, p);
        }
    }
    for p in &applied_set {
        if let Some(v) = get_path(applied, p) {
            set_path(&mut obj, p, v.clone());
        }
    }
    let unchanged_set = previous == applied_set;
    match managed
        .iter_mut()
        .find(|m| m.manager == manager && m.operation == "Apply" && m.subresource.is_none())
    {
        Some(m) => {
            m.fields = applied_set;
            m.api_version = api_version;
            if !unchanged_set || obj != *current {
                m.time = now.to_owned();
            }
        }
        None => managed.push(Managed::apply(manager, api_version, now, applied_set)),
    }
    write_managed(&mut obj, &managed);
    Ok(obj)
}

/// Group the conflicts as Kubernetes' message does.
pub fn conflict_message(conflicts: &[Conflict], api_version: &str) -> String {
    let mut by: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for c in conflicts {
        by.entry(&c.manager).or_default().push(&c.field);
    }
    let parts: Vec<String> = by
        .iter()
        .map(|(m, fields)| {
            let fs: Vec<String> = fields.iter().map(|f| format!("- {f}")).collect();
            format!(
                "conflict with \"{m}\" using {api_version}:\n{}",
                fs.join("\n")
            )
        })
        .collect();
    let n = conflicts.len();
    format!(
        "Apply failed with {n} conflict{}: {}",
        if n == 1 { "" } else { "s" },
        parts.join("\n")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge_patch_follows_rfc7386() {
        let mut t = json!({"a": "b", "c": {"d": "e", "f": "g"}});
        merge_patch(&mut t, &json!({"a": "z", "c": {"f": null}}));
        assert_eq!(t, json!({"a": "z", "c": {"d": "e"}}));
        merge_patch(&mut t, &json!({"list": [1, 2]}));
        merge_patch(&mut t, &json!({"list": [3]}));
        assert_eq!(t["list"], json!([3]));
    }

    #[test]
    fn strategic_patch_merges_containers_by_name() {
        let mut t = json!({"spec": {"containers": [{"name": "a", "image": "x"}, {"name": "b", "image": "y"}]}});
        strategic_merge_patch(
            &mut t,
            &json!({"spec": {"$setElementOrder/containers": [{"name": "a"}], "containers": [{"name": "a", "image": "z"}, {"name": "b", "$patch": "delete"}]}}),
        );
        assert_eq!(
            t,
            json!({"spec": {"containers": [{"name": "a", "image": "z"}]}})
        );
    }

    #[test]
    fn fields_v1_round_trips() {
        let obj = json!({"apiVersion": "v1", "metadata": {"name": "x", "labels": {"a": "1"}}, "data": {"k": "v"}});
        let set = leaves(&obj, false);
        assert_eq!(parse_fields_v1(&fields_v1(&set)), set);
        assert!(set.contains(&vec!["metadata".into(), "labels".into(), "a".into()]));
        assert!(!set.contains(&vec!["metadata".into(), "name".into()]));
    }

    #[test]
    fn apply_conflicts_unless_forced_and_drops_fields_a_manager_stops_applying() {
        let a1 = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}, "data": {"k": "1", "old": "o"}});
        let obj = server_side_apply(None, &a1, "hypd", false, "t0", false).unwrap();
        let a2 = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}, "data": {"k": "1"}});
        let obj = server_side_apply(Some(&obj), &a2, "hypd", false, "t1", false).unwrap();
        assert_eq!(obj["data"], json!({"k": "1"}));
        let again = server_side_apply(Some(&obj), &a2, "hypd", false, "t2", false).unwrap();
        assert_eq!(again, obj, "re-applying the same config changes nothing");
        let b = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}, "data": {"k": "2"}});
        let err = server_side_apply(Some(&obj), &b, "other", false, "t3", false).unwrap_err();
        assert_eq!(
            err,
            vec![Conflict {
                manager: "hypd".into(),
                field: ".data.k".into()
            }]
        );
        let forced = server_side_apply(Some(&obj), &b, "other", true, "t3", false).unwrap();
        assert_eq!(forced["data"]["k"], "2");
        let owners: Vec<String> = read_managed(&forced)
            .into_iter()
            .map(|m| m.manager)
            .collect();
        assert_eq!(owners, vec!["other"]);
    }
}
