//! A list in an answer that the server may hold already serialized. Large answers built
//! from a cache (the instance-type catalogue: ~30 kB) are the same bytes for every asker
//! until the cache refills, so serializing them again per request is pure waste; on the
//! wire and in the schema a `Listing<T>` is exactly a JSON array of `T`.

use std::sync::Arc;

use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::value::RawValue;

#[derive(Clone, Debug)]
pub enum Listing<T> {
    Items(Vec<T>),
    /// The items, serialized once (a JSON array), shared by every answer that sends them.
    Rendered(Arc<RawValue>),
}

impl<T: Serialize> Listing<T> {
    /// Serializes `items` once, to be sent as they are from now on.
    pub fn render<'a>(items: impl IntoIterator<Item = &'a T>) -> Result<Self, serde_json::Error>
    where
        T: 'a,
    {
        let items: Vec<&T> = items.into_iter().collect();
        let raw = serde_json::value::to_raw_value(&items)?;
        Ok(Listing::Rendered(Arc::from(raw)))
    }
}

impl<T: DeserializeOwned> Listing<T> {
    /// The items, read back from their JSON when they were rendered.
    pub fn into_items(self) -> Result<Vec<T>, serde_json::Error> {
        match self {
            Listing::Items(items) => Ok(items),
            Listing::Rendered(raw) => serde_json::from_str(raw.get()),
        }
    }
}

impl<T> From<Vec<T>> for Listing<T> {
    fn from(items: Vec<T>) -> Self {
        Listing::Items(items)
    }
}

impl<T: PartialEq + Serialize> PartialEq for Listing<T> {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Listing::Items(a), Listing::Items(b)) => a == b,
            // Equal JSON text; a rendered list compared with items compares their JSON.
            _ => json_text(self) == json_text(other),
        }
    }
}

fn json_text<T: Serialize>(l: &Listing<T>) -> Option<String> {
    serde_json::to_string(l).ok()
}

impl<T: Serialize> Serialize for Listing<T> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Listing::Items(items) => items.serialize(s),
            Listing::Rendered(raw) => raw.serialize(s),
        }
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Listing<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Vec::<T>::deserialize(d).map(Listing::Items)
    }
}

impl<T: JsonSchema> JsonSchema for Listing<T> {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        Vec::<T>::schema_name()
    }

    fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        Vec::<T>::json_schema(generator)
    }

    fn inline_schema() -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rendered_and_owned_lists_are_the_same_json() {
        let items = vec!["a".to_owned(), "b\"c".to_owned()];
        let rendered = Listing::render(&items).unwrap();
        let owned = Listing::Items(items.clone());
        assert_eq!(
            serde_json::to_string(&rendered).unwrap(),
            serde_json::to_string(&owned).unwrap()
        );
        assert_eq!(rendered, owned);
        let read: Listing<String> = serde_json::from_str(r#"["a","b\"c"]"#).unwrap();
        assert_eq!(read.into_items().unwrap(), items);
        assert_eq!(rendered.into_items().unwrap(), items);
        assert_eq!(
            serde_json::to_value(schemars::schema_for!(Listing<String>)).unwrap()["type"],
            "array"
        );
    }
}
