//! A small object hypd writes (a lifecycle script): written when missing or different,
//! so a step run again makes no call beyond reading it.

use app::api::ApiError;
use app::api::plan::{Action, Change};

use super::Client;
use crate::aws::SdkResultExt;
use crate::resources::Resource;

const KIND: &str = "s3:Object";

pub struct Object {
    pub s3: Client,
    pub bucket: String,
    pub key: String,
    pub body: &'static [u8],
    pub content_type: &'static str,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Op {
    Put,
}

impl Resource for Object {
    /// The object's bytes, `None` when it does not exist.
    type Observed = Option<Vec<u8>>;
    type Op = Op;

    async fn observe(&self) -> Result<Option<Vec<u8>>, ApiError> {
        let Some(out) = self
            .s3
            .get_object()
            .bucket(&self.bucket)
            .key(&self.key)
            .send()
            .await
            .found("s3", "GetObject")?
        else {
            return Ok(None);
        };
        let bytes = out.body.collect().await.map_err(|e| ApiError::Upstream {
            service: "s3".into(),
            call: "GetObject".into(),
            code: None,
            message: format!("reading s3://{}/{}: {e}", self.bucket, self.key),
            request_id: None,
            transient: true,
        })?;
        Ok(Some(bytes.into_bytes().to_vec()))
    }

    fn diff(&self, observed: &Option<Vec<u8>>) -> Result<Vec<Op>, ApiError> {
        Ok(if observed.as_deref() == Some(self.body) {
            Vec::new()
        } else {
            vec![Op::Put]
        })
    }

    async fn apply(&self, _: &Op, observed: &mut Option<Vec<u8>>) -> Result<(), ApiError> {
        self.s3
            .put_object()
            .bucket(&self.bucket)
            .key(&self.key)
            .body(self.body.to_vec().into())
            .content_type(self.content_type)
            .send()
            .await
            .upstream("s3", "PutObject")?;
        *observed = Some(self.body.to_vec());
        Ok(())
    }

    fn describe(&self, _: &Op, observed: &Option<Vec<u8>>) -> Change {
        let action = if observed.is_some() {
            Action::Update
        } else {
            Action::Create
        };
        Change::new(action, KIND, format!("s3://{}/{}", self.bucket, self.key))
    }
    fn assume(&self, _: &Op, observed: &mut Option<Vec<u8>>) {
        *observed = Some(self.body.to_vec());
    }
}
