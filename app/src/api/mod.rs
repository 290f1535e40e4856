//! The contract: every request and response type of every face, the values that reject
//! bad input while deserializing, the one error type, and the command registry. This
//! module compiles to wasm: no server-only dependency may enter it.

pub mod call;
pub mod clusters;
pub mod command;
pub mod diagnose;
pub mod error;
pub mod features;
pub mod inference;
pub mod inspect;
pub mod instance_groups;
pub mod jumpstart;
pub mod listing;
pub mod mlflow;
pub mod models;
pub mod nodes;
pub mod operations;
pub mod plan;
pub mod software;
pub mod storage;
pub mod tokens;
pub mod training;
pub mod values;

pub use command::{Command, CommandEntry, CommandSpec, Effect, HttpMethod, Role, decode};
pub use error::{ApiError, FieldError, Problems};

/// Calls `$m! { Type, Type, … }` with every command type: the one list the registry, the
/// server's dispatch and the tests are generated from.
#[macro_export]
macro_rules! for_each_command {
    ($m:ident) => {
        $m! {
            $crate::api::inspect::Whoami,
            $crate::api::inspect::ListRegions,
            $crate::api::inspect::ListAvailabilityZones,
            $crate::api::inspect::ListInstanceTypes,
            $crate::api::inspect::ListCapacity,
            $crate::api::clusters::ListClusters,
            $crate::api::clusters::GetCluster,
            $crate::api::clusters::DescribeCluster,
            $crate::api::clusters::CreateCluster,
            $crate::api::clusters::ImportCluster,
            $crate::api::clusters::DeleteCluster,
            $crate::api::clusters::GetDrift,
            $crate::api::clusters::ReconcileCluster,
            $crate::api::instance_groups::ListInstanceGroups,
            $crate::api::instance_groups::AddInstanceGroup,
            $crate::api::instance_groups::UpdateInstanceGroup,
            $crate::api::instance_groups::DeleteInstanceGroup,
            $crate::api::nodes::ListNodes,
            $crate::api::nodes::RebootNodes,
            $crate::api::nodes::ReplaceNodes,
            $crate::api::nodes::DeleteNodes,
            $crate::api::software::UpdateClusterSoftware,
            $crate::api::storage::ListStorage,
            $crate::api::storage::CreateS3Storage,
            $crate::api::storage::CreateFsxStorage,
            $crate::api::storage::DeleteStorage,
            $crate::api::storage::ListStorageContents,
            $crate::api::storage::UploadStorageFile,
            $crate::api::storage::CheckStorage,
            $crate::api::models::ListModels,
            $crate::api::models::DownloadModel,
            $crate::api::training::CheckTrainingJob,
            $crate::api::training::SubmitTrainingJob,
            $crate::api::training::ListTrainingJobs,
            $crate::api::training::GetTrainingJob,
            $crate::api::training::GetTrainingJobLogs,
            $crate::api::training::GetTrainingJobMetrics,
            $crate::api::training::DeleteTrainingJob,
            $crate::api::mlflow::CreateMlflowTrackingServer,
            $crate::api::inference::DeployModelServer,
            $crate::api::inference::DeployInferenceEndpoint,
            $crate::api::jumpstart::ListJumpstartModels,
            $crate::api::jumpstart::DeployJumpstartModel,
            $crate::api::inference::ListEndpoints,
            $crate::api::inference::GetEndpoint,
            $crate::api::inference::InvokeEndpoint,
            $crate::api::inference::ScaleEndpoint,
            $crate::api::inference::DeleteEndpoint,
            $crate::api::inference::AssignPoolWorkers,
            $crate::api::inference::ReleasePoolWorkers,
            $crate::api::features::GetFeatures,
            $crate::api::features::UpdateFeatures,
            $crate::api::operations::ListOperations,
            $crate::api::operations::GetOperation,
            $crate::api::operations::WaitOperation,
            $crate::api::operations::RetryOperation,
            $crate::api::operations::CancelOperation,
            $crate::api::diagnose::DiagnoseOperation,
            $crate::api::diagnose::DiagnoseNode,
            $crate::api::diagnose::DiagnoseTrainingJob,
            $crate::api::tokens::CreateToken,
            $crate::api::tokens::ListTokens,
            $crate::api::tokens::RevokeToken,
        }
    };
}

macro_rules! registry {
    ($($c:ty),* $(,)?) => {
        /// Every command, in the order tools and routes are listed.
        pub const COMMANDS: &[CommandEntry] = &[$(CommandEntry::of::<$c>()),*];
    };
}
for_each_command!(registry);

pub fn find(name: &str) -> Option<&'static CommandEntry> {
    COMMANDS.iter().find(|e| e.spec.name == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every destructive command is two-phase: its request takes `confirmation` (and
    /// `dry_run`), its answer can be the plan with a confirmation, and its description
    /// tells an agent the two steps. The server's gate runs a destructive command only
    /// with a confirmation its `Command::confirmation` hands over.
    #[test]
    fn destructive_commands_ask_for_confirmation() {
        let mut generator = schemars::generate::SchemaSettings::draft2020_12().into_generator();
        for e in COMMANDS
            .iter()
            .filter(|e| e.spec.effect == Effect::Destructive)
        {
            let name = e.spec.name;
            let request = serde_json::to_value((e.request_schema)(&mut generator)).unwrap();
            let request = match request.get("$ref").and_then(|r| r.as_str()) {
                Some(r) => serde_json::to_value(generator.definitions()).unwrap()
                    [r.rsplit('/').next().unwrap()]
                .clone(),
                None => request,
            };
            for field in ["confirmation", "dry_run"] {
                assert!(
                    request["properties"].get(field).is_some(),
                    "{name} takes no {field}: {request:#}"
                );
            }
            let output = serde_json::to_string(&(e.output_schema)(&mut generator)).unwrap();
            assert!(output.contains("Gated"), "{name} answers no plan: {output}");
            assert!(
                e.spec.description.contains("confirmation"),
                "{name}'s description does not tell the two steps"
            );
        }
    }

    #[test]
    fn names_are_unique_and_mutations_name_their_status_command() {
        let mut names: Vec<&str> = COMMANDS.iter().map(|e| e.spec.name).collect();
        names.sort_unstable();
        let before = names.len();
        names.dedup();
        assert_eq!(before, names.len(), "duplicate command names");
        for e in COMMANDS {
            let s = e.spec;
            if s.effect != Effect::ReadOnly {
                let status = s
                    .status_command
                    .unwrap_or_else(|| panic!("{} names no status command", s.name));
                assert!(
                    find(status).is_some(),
                    "{}: unknown status command {status}",
                    s.name
                );
                assert!(
                    s.role >= Role::Operator,
                    "{}: a viewer may not mutate",
                    s.name
                );
            }
            assert!(s.path.starts_with("/api/v1/"), "{}", s.name);
            assert!(
                s.description.len() > 60,
                "{}: describe it for an agent",
                s.name
            );
        }
    }

    #[test]
    fn routes_are_unique() {
        let mut routes: Vec<(&str, &str)> = COMMANDS
            .iter()
            .map(|e| (e.spec.method.as_str(), e.spec.path))
            .collect();
        routes.sort_unstable();
        let before = routes.len();
        routes.dedup();
        assert_eq!(before, routes.len());
    }

    #[test]
    fn path_params_are_request_fields() {
        for e in COMMANDS {
            let mut g = schemars::SchemaGenerator::default();
            let schema = serde_json::to_value((e.request_schema)(&mut g)).unwrap();
            let defs = serde_json::to_value(g.definitions()).unwrap();
            let resolved = match schema.get("$ref").and_then(|r| r.as_str()) {
                Some(r) => defs[r.rsplit('/').next().unwrap()].clone(),
                None => schema,
            };
            for p in e.spec.path_params() {
                assert!(
                    resolved["properties"].get(p).is_some(),
                    "{}: {{{p}}} is not a field",
                    e.spec.name
                );
            }
        }
    }
}
