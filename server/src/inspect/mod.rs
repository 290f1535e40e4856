//! The inspection commands (`whoami`, `list_regions`, `list_availability_zones`,
//! `list_instance_types`): what a person or an agent asks before choosing, answered from
//! the catalogue (`catalogue`), which pre-flights read as well.

pub mod catalogue;

use app::api::ApiError;
use app::api::inspect::{
    AvailabilityZoneList, InstanceTypeInfo, InstanceTypeList, ListAvailabilityZones,
    ListInstanceTypes, ListRegions, RegionList, Whoami, WhoamiOutput,
};
use app::api::values::Region;

pub use catalogue::{Cache, FRESH_FOR, Inspector, check_offered, hyperpod_supports};

use crate::auth::Actor;
use crate::aws::Aws;
use crate::operation::pipeline::{Asked, Catalogue};
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
