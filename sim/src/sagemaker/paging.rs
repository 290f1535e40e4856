//! Paging of SageMaker's List calls: `SortOrder`, `MaxResults` and opaque `NextToken`s,
//! refused as AWS's request validation refuses them, so a client that invents or garbles
//! a token fails instead of listing from somewhere else.

use serde_json::Value;

use super::{str_field, validation};
use crate::world::AwsError;

/// Which way a List call sorts when the request names no `SortOrder`; the API reference
/// says so per operation (ListClusterNodes: Ascending; ListMlflowTrackingServers:
/// Descending).
#[derive(Clone, Copy, PartialEq)]
pub(super) enum Order {
    Ascending,
    Descending,
}

/// The page of `items` (sorted ascending) a List call asks for: reversed when the
/// `SortOrder` (or the operation's default) is Descending; from the offset a `NextToken`
/// carries, at most `MaxResults` (1 to 100, default 100); with the next page's token, if
/// any. Out-of-range values are refused as AWS's request validation refuses them.
pub(super) fn page<T>(
    body: &Value,
    mut items: Vec<T>,
    default: Order,
) -> Result<(Vec<T>, Option<String>), AwsError> {
    let order = match str_field(body, "SortOrder") {
        None => default,
        Some("Ascending") => Order::Ascending,
        Some("Descending") => Order::Descending,
        Some(other) => {
            return Err(validation(format!(
                "1 validation error detected: Value '{other}' at 'sortOrder' failed to satisfy constraint: Member must satisfy enum value set: [Ascending, Descending]"
            )));
        }
    };
    if order == Order::Descending {
        items.reverse();
    }
    let max = match body.get("MaxResults").filter(|v| !v.is_null()) {
        None => 100,
        Some(v) => match v.as_i64() {
            Some(n @ 1..=100) => n as usize,
            Some(n) if n < 1 => {
                return Err(validation(format!(
                    "1 validation error detected: Value '{n}' at 'maxResults' failed to satisfy constraint: Member must have value greater than or equal to 1"
                )));
            }
            Some(n) => {
                return Err(validation(format!(
                    "1 validation error detected: Value '{n}' at 'maxResults' failed to satisfy constraint: Member must have value less than or equal to 100"
                )));
            }
            None => return Err(validation(format!("MaxResults {v} is not an integer"))),
        },
    };
    let start = match str_field(body, "NextToken") {
        None => 0,
        Some(token) => offset_of(token).ok_or_else(|| {
            // AWS documents no message for this; ValidationException is its code for
            // a request field it cannot accept.
            validation(format!("Invalid NextToken: {token}"))
        })?,
    };
    let next = (start + max < items.len()).then(|| page_token(start + max));
    Ok((items.into_iter().skip(start).take(max).collect(), next))
}

/// A `NextToken` for the page at `offset`. AWS's tokens are opaque, so callers must
/// echo them unchanged: a checksum makes a garbled or made-up token fail instead of
/// quietly listing from somewhere else.
pub(super) fn page_token(offset: usize) -> String {
    let check = crate::world::fnv1a(&format!("hypd-sim page {offset}")) as u32;
    format!("{check:08x}{offset:08x}")
}

pub(super) fn offset_of(token: &str) -> Option<usize> {
    let offset = usize::from_str_radix(token.get(8..)?, 16).ok()?;
    (token.len() == 16 && page_token(offset) == token).then_some(offset)
}
