//! What the account offers, asked of EC2: regions, Availability Zones and instance types
//! with their accelerator and EFA facts. Answers are cached for a few minutes per region
//! (these facts change rarely and consoles and agents ask often); every answer says how
//! fresh it is, and `refresh` asks AWS again.

use std::collections::HashMap;
use std::future::Future;
use std::time::{Duration, Instant, SystemTime};

use app::api::ApiError;
use app::api::inspect::{
    Accelerator, AcceleratorKind, AvailabilityZone, Freshness, InstanceTypeInfo, RegionInfo,
    efa_only_allowed,
};
use aws_sdk_ec2::types::{Filter, InstanceTypeInfo as Ec2Type, LocationType};
use tokio::sync::Mutex;

use crate::aws::{Aws, UpstreamError};
use crate::clock;

/// How long an inspection answer is served from the cache.
pub const FRESH_FOR: Duration = Duration::from_secs(300);

struct Entry<V> {
    at: Instant,
    fetched: SystemTime,
    value: V,
}

/// A small per-key cache with a freshness report.
pub struct Cache<V> {
    entries: Mutex<HashMap<String, Entry<V>>>,
    ttl: Duration,
}

impl<V: Clone> Cache<V> {
    pub fn new(ttl: Duration) -> Self {
        Self {
            entries: Mutex::new(HashMap::new()),
            ttl,
        }
    }

    /// The cached value, or `fetch`'s, stored. The lock is not held while fetching, so a
    /// slow AWS call never blocks answers for other keys.
    pub async fn get_or_fetch<F, Fut>(
        &self,
        key: &str,
        refresh: bool,
        fetch: F,
    ) -> Result<(V, Freshness), ApiError>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<V, ApiError>>,
    {
        if !refresh
            && let Some(e) = self
                .entries
                .lock()
                .await
                .get(key)
                .filter(|e| e.at.elapsed() < self.ttl)
        {
            return Ok((e.value.clone(), freshness(e.fetched, true)));
        }
        let value = fetch().await?;
        let fetched = SystemTime::now();
        self.entries.lock().await.insert(
            key.to_owned(),
            Entry {
                at: Instant::now(),
                fetched,
                value: value.clone(),
            },
        );
        Ok((value, freshness(fetched, false)))
    }
}

fn freshness(fetched: SystemTime, cached: bool) -> Freshness {
    Freshness {
        fetched_at: clock::format_time(fetched),
        age_seconds: fetched.elapsed().unwrap_or_default().as_secs(),
        cached,
    }
}

impl From<UpstreamError> for ApiError {
    fn from(e: UpstreamError) -> Self {
        ApiError::Upstream {
            service: e.service.to_owned(),
            call: e.operation.to_owned(),
            code: e.code,
            message: e.message,
            request_id: e.request_id,
        }
    }
}

pub struct Inspector {
    regions: Cache<Vec<RegionInfo>>,
    zones: Cache<Vec<AvailabilityZone>>,
    types: Cache<Vec<InstanceTypeInfo>>,
}

impl Default for Inspector {
    fn default() -> Self {
        Self {
            regions: Cache::new(FRESH_FOR),
            zones: Cache::new(FRESH_FOR),
            types: Cache::new(FRESH_FOR),
        }
    }
}

impl Inspector {
    pub async fn regions(
        &self,
        aws: &Aws,
        refresh: bool,
    ) -> Result<(Vec<RegionInfo>, Freshness), ApiError> {
        let home = aws.region().unwrap_or_else(|| "us-east-1".to_owned());
        self.regions
            .get_or_fetch("all", refresh, || async {
                let out = aws
                    .ec2(&home)
                    .describe_regions()
                    .send()
                    .await
                    .map_err(|e| UpstreamError::from_sdk("ec2", "DescribeRegions", e))?;
                let mut regions: Vec<RegionInfo> = out
                    .regions()
                    .iter()
                    .filter_map(|r| {
                        Some(RegionInfo {
                            name: r.region_name()?.to_owned(),
                            opt_in_status: r.opt_in_status().map(str::to_owned),
                        })
                    })
                    .collect();
                regions.sort_by(|a, b| a.name.cmp(&b.name));
                Ok(regions)
            })
            .await
    }

    pub async fn zones(
        &self,
        aws: &Aws,
        region: &str,
        refresh: bool,
    ) -> Result<(Vec<AvailabilityZone>, Freshness), ApiError> {
        self.zones
            .get_or_fetch(region, refresh, || async {
                let out = aws
                    .ec2(region)
                    .describe_availability_zones()
                    .send()
                    .await
                    .map_err(|e| UpstreamError::from_sdk("ec2", "DescribeAvailabilityZones", e))?;
                let mut zones: Vec<AvailabilityZone> = out
                    .availability_zones()
                    .iter()
                    .filter_map(|z| {
                        Some(AvailabilityZone {
                            name: z.zone_name()?.to_owned(),
                            zone_id: z.zone_id().unwrap_or_default().to_owned(),
                            state: z.state().map(|s| s.as_str().to_owned()).unwrap_or_default(),
                            zone_type: z.zone_type().map(str::to_owned),
                        })
                    })
                    .collect();
                zones.sort_by(|a, b| a.name.cmp(&b.name));
                Ok(zones)
            })
            .await
    }

    /// Every instance type of the region with the zones offering it.
    pub async fn instance_types(
        &self,
        aws: &Aws,
        region: &str,
        refresh: bool,
    ) -> Result<(Vec<InstanceTypeInfo>, Freshness), ApiError> {
        self.types
            .get_or_fetch(region, refresh, || fetch_instance_types(aws, region))
            .await
    }
}

async fn fetch_instance_types(aws: &Aws, region: &str) -> Result<Vec<InstanceTypeInfo>, ApiError> {
    let client = aws.ec2(region);
    let mut offered: HashMap<String, Vec<String>> = HashMap::new();
    let mut pages = client
        .describe_instance_type_offerings()
        .location_type(LocationType::AvailabilityZone)
        .into_paginator()
        .send();
    while let Some(page) = pages.next().await {
        let page =
            page.map_err(|e| UpstreamError::from_sdk("ec2", "DescribeInstanceTypeOfferings", e))?;
        for o in page.instance_type_offerings() {
            if let (Some(t), Some(zone)) = (o.instance_type(), o.location()) {
                offered
                    .entry(t.as_str().to_owned())
                    .or_default()
                    .push(zone.to_owned());
            }
        }
    }

    let mut types = Vec::new();
    let mut pages = client
        .describe_instance_types()
        .filters(
            Filter::builder()
                .name("current-generation")
                .values("true")
                .build(),
        )
        .into_paginator()
        .send();
    while let Some(page) = pages.next().await {
        let page = page.map_err(|e| UpstreamError::from_sdk("ec2", "DescribeInstanceTypes", e))?;
        types.extend(
            page.instance_types()
                .iter()
                .filter_map(|t| describe_type(t, &offered)),
        );
    }
    types.sort_by(|a, b| a.instance_type.cmp(&b.instance_type));
    Ok(types)
}

fn describe_type(t: &Ec2Type, offered: &HashMap<String, Vec<String>>) -> Option<InstanceTypeInfo> {
    let name = t.instance_type()?.as_str().to_owned();
    let network = t.network_info();
    let efa_supported = network.and_then(|n| n.efa_supported()).unwrap_or(false);
    let max_efa_interfaces = network
        .and_then(|n| n.efa_info())
        .and_then(|e| e.maximum_efa_interfaces())
        .and_then(|n| u32::try_from(n).ok())
        .unwrap_or(0);
    let mut zones = offered.get(&name).cloned().unwrap_or_default();
    zones.sort();
    Some(InstanceTypeInfo {
        hyperpod_instance_type: format!("ml.{name}"),
        vcpus: t
            .v_cpu_info()
            .and_then(|v| v.default_v_cpus())
            .and_then(|n| u32::try_from(n).ok())
            .unwrap_or(0),
        memory_mib: t
            .memory_info()
            .and_then(|m| m.size_in_mib())
            .and_then(|n| u64::try_from(n).ok())
            .unwrap_or(0),
        accelerator: accelerator(t),
        efa_supported,
        max_efa_interfaces,
        efa_only_allowed: efa_supported && efa_only_allowed(&name, Some(max_efa_interfaces)),
        network_performance: network
            .and_then(|n| n.network_performance())
            .map(str::to_owned),
        offered_in: zones,
        instance_type: name,
    })
}

fn accelerator(t: &Ec2Type) -> Option<Accelerator> {
    if let Some(gpu) = t.gpu_info().and_then(|g| g.gpus().first()) {
        return Some(Accelerator {
            kind: AcceleratorKind::Gpu,
            manufacturer: gpu.manufacturer().unwrap_or_default().to_owned(),
            name: gpu.name().unwrap_or_default().to_owned(),
            count: gpu.count().and_then(|n| u32::try_from(n).ok()).unwrap_or(0),
            memory_mib: gpu
                .memory_info()
                .and_then(|m| m.size_in_mib())
                .and_then(|n| u64::try_from(n).ok()),
        });
    }
    if let Some(dev) = t.neuron_info().and_then(|n| n.neuron_devices().first()) {
        let name = dev.name().unwrap_or_default().to_owned();
        let kind = if name.to_ascii_lowercase().contains("inferentia") {
            AcceleratorKind::Inferentia
        } else {
            AcceleratorKind::Trainium
        };
        return Some(Accelerator {
            kind,
            manufacturer: "AWS".to_owned(),
            name,
            count: dev.count().and_then(|n| u32::try_from(n).ok()).unwrap_or(0),
            memory_mib: dev
                .memory_info()
                .and_then(|m| m.size_in_mib())
                .and_then(|n| u64::try_from(n).ok()),
        });
    }
    t.inference_accelerator_info()
        .and_then(|i| i.accelerators().first())
        .map(|a| Accelerator {
            kind: AcceleratorKind::Inferentia,
            manufacturer: a.manufacturer().unwrap_or("AWS").to_owned(),
            name: a.name().unwrap_or_default().to_owned(),
            count: a.count().and_then(|n| u32::try_from(n).ok()).unwrap_or(0),
            memory_mib: a
                .memory_info()
                .and_then(|m| m.size_in_mib())
                .and_then(|n| u64::try_from(n).ok()),
        })
}
