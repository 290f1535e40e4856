//! The inspection commands (`whoami`, `list_regions`, `list_availability_zones`,
//! `list_instance_types`, `list_capacity`): what a person or an agent asks before
//! choosing, answered from the catalogue (`catalogue`), which pre-flights read as well,
//! and for capacity from the account's quotas and training plans, read now.

pub mod catalogue;

use app::api::ApiError;
use app::api::inspect::{
    AvailabilityZoneList, Capacity, InstanceTypeInfo, InstanceTypeList, ListAvailabilityZones,
    ListCapacity, ListInstanceTypes, ListRegions, QuotaUse, RegionList, Whoami, WhoamiOutput,
};
use app::api::values::Region;

pub use catalogue::{Cache, FRESH_FOR, Inspector, check_offered, hyperpod_supports};

use crate::auth::Actor;
use crate::aws::Aws;
use crate::operation::pipeline::{Asked, Catalogue};
use crate::resources::sagemaker::capacity;
use crate::service::{Handler, Service};
use catalogue::{field_set, render_fields};

impl Handler<Whoami> for Service {
    async fn handle(&self, actor: &Actor, _: Whoami) -> Result<WhoamiOutput, ApiError> {
        let id = self.aws.identity().await?;
        Ok(WhoamiOutput {
            account: id.account,
            arn: id.arn,
            region: self.aws.region(),
            sandbox: self.sandbox,
            role: actor.role,
            token_name: actor.name.clone(),
        })
    }
}

impl Handler<ListRegions> for Service {
    async fn handle(&self, _: &Actor, r: ListRegions) -> Result<RegionList, ApiError> {
        let (regions, freshness) = self.catalogue.regions(&self.aws, r.refresh).await?;
        Ok(RegionList {
            regions: regions.to_vec(),
            freshness,
        })
    }
}

impl Handler<ListAvailabilityZones> for Service {
    async fn handle(
        &self,
        _: &Actor,
        r: ListAvailabilityZones,
    ) -> Result<AvailabilityZoneList, ApiError> {
        let region = self.catalogue.region(&self.aws, r.region.as_ref()).await?;
        let (zones, freshness) = self.catalogue.zones(&self.aws, &region, r.refresh).await?;
        Ok(AvailabilityZoneList {
            region,
            zones: zones.to_vec(),
            freshness,
        })
    }
}

impl Handler<ListCapacity> for Service {
    async fn handle(&self, _: &Actor, r: ListCapacity) -> Result<Capacity, ApiError> {
        let fetched_at = crate::clock::now();
        let region = self.catalogue.region(&self.aws, r.region.as_ref()).await?;
        let sm = self.aws.sagemaker(&region);
        let service_quotas = self.aws.service_quotas(&region);
        let (quotas, in_use, plans) = tokio::try_join!(
            capacity::all_cluster_usage_quotas(&service_quotas),
            capacity::instances_in_use(&sm),
            capacity::training_plans(&sm),
        )?;
        let wanted = |t: &str| {
            r.instance_types.is_empty() || r.instance_types.iter().any(|w| w.as_str() == t)
        };
        let types: std::collections::BTreeSet<&String> =
            quotas.keys().chain(in_use.keys()).collect();
        let quotas = types
            .into_iter()
            .filter(|t| wanted(t))
            .filter_map(|t| {
                let quota = quotas.get(t).copied().unwrap_or(0.0).max(0.0) as u32;
                let used = in_use.get(t).copied().unwrap_or(0).max(0) as u32;
                (quota > 0 || used > 0).then(|| QuotaUse {
                    instance_type: t.clone(),
                    quota,
                    in_use: used,
                    free: quota.saturating_sub(used),
                })
            })
            .collect();
        let training_plans = plans
            .into_iter()
            .filter(|p| {
                r.instance_types.is_empty()
                    || p.reserved
                        .iter()
                        .any(|c| c.instance_type.as_deref().is_some_and(wanted))
            })
            .collect();
        Ok(Capacity {
            region: region.to_string(),
            quotas,
            training_plans,
            fetched_at,
        })
    }
}

impl Handler<ListInstanceTypes> for Service {
    async fn handle(&self, _: &Actor, r: ListInstanceTypes) -> Result<InstanceTypeList, ApiError> {
        let region = self.catalogue.region(&self.aws, r.region.as_ref()).await?;
        if let Some(az) = &r.availability_zone {
            self.catalogue
                .check_zone(&self.aws, &region, az.as_str(), "availability_zone")
                .await?;
        }
        let (all, freshness) = self
            .catalogue
            .instance_types(&self.aws, &region, r.refresh)
            .await?;
        let az = r.availability_zone.as_ref().map(|z| z.as_str().to_owned());
        let keep = |t: &InstanceTypeInfo| {
            (!r.accelerated_only || t.accelerator.is_some())
                && (r.instance_types.is_empty()
                    || r.instance_types
                        .iter()
                        .any(|w| w.as_str() == t.instance_type))
                && az
                    .as_ref()
                    .is_none_or(|az| t.offered_in.iter().any(|z| z == az))
        };
        let fields = field_set(&r.fields);
        let instance_types = if r.instance_types.is_empty() {
            self.catalogue.rendered_list(
                (region.clone(), az.clone(), r.accelerated_only, fields),
                &all,
                keep,
            )?
        } else {
            render_fields(all.iter().filter(|t| keep(t)), fields).map_err(ApiError::internal)?
        };
        Ok(InstanceTypeList {
            region,
            instance_types,
            freshness,
        })
    }
}

/// The catalogue as the engine's pre-flights ask it.
impl Catalogue for Inspector {
    fn region<'a>(&'a self, aws: &'a Aws, requested: Option<&'a Region>) -> Asked<'a, String> {
        Box::pin(Inspector::region(self, aws, requested))
    }

    fn check_zone<'a>(
        &'a self,
        aws: &'a Aws,
        region: &'a str,
        zone: &'a str,
        field: &'a str,
    ) -> Asked<'a, ()> {
        Box::pin(Inspector::check_zone(self, aws, region, zone, field))
    }
}
