//! S3 objects hypd makes: a cluster's shared bucket and the files it puts in it (the
//! lifecycle script). Buckets are addressed path-style (see `Aws::s3`).

pub mod bucket;
pub mod object;

pub use aws_sdk_s3::Client;
