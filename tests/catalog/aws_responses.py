"""API responses shaped exactly like the real ones (botocore's Stubber validates them).

Values follow the public EC2 DescribeInstanceTypes output for these types and the Price List API
format (each PriceList entry is a JSON document serialised as a string).
"""

from __future__ import annotations

import datetime
import json
from typing import Any


def p5_48xlarge() -> dict[str, Any]:
    return {
        "InstanceType": "p5.48xlarge",
        "CurrentGeneration": True,
        "FreeTierEligible": False,
        "SupportedUsageClasses": ["on-demand", "spot", "capacity-block"],
        "SupportedRootDeviceTypes": ["ebs"],
        "SupportedVirtualizationTypes": ["hvm"],
        "BareMetal": False,
        "Hypervisor": "nitro",
        "ProcessorInfo": {"SupportedArchitectures": ["x86_64"], "SustainedClockSpeedInGhz": 3.6, "Manufacturer": "AMD"},
        "VCpuInfo": {
            "DefaultVCpus": 192,
            "DefaultCores": 96,
            "DefaultThreadsPerCore": 2,
            "ValidThreadsPerCore": [1, 2],
        },
        "MemoryInfo": {"SizeInMiB": 2097152},
        "InstanceStorageSupported": True,
        "InstanceStorageInfo": {
            "TotalSizeInGB": 30400,
            "Disks": [{"SizeInGB": 3800, "Count": 8, "Type": "ssd"}],
            "NvmeSupport": "required",
            "EncryptionSupport": "required",
        },
        "EbsInfo": {"EbsOptimizedSupport": "default", "EncryptionSupport": "supported", "NvmeSupport": "required"},
        "NetworkInfo": {
            "NetworkPerformance": "3200 Gigabit",
            "MaximumNetworkInterfaces": 64,
            "MaximumNetworkCards": 32,
            "DefaultNetworkCardIndex": 0,
            "NetworkCards": [
                {
                    "NetworkCardIndex": i,
                    "NetworkPerformance": "100 Gigabit",
                    "MaximumNetworkInterfaces": 2,
                    "BaselineBandwidthInGbps": 100.0,
                    "PeakBandwidthInGbps": 100.0,
                }
                for i in range(32)
            ],
            "Ipv4AddressesPerInterface": 50,
            "Ipv6AddressesPerInterface": 50,
            "Ipv6Supported": True,
            "EnaSupport": "required",
            "EfaSupported": True,
            "EfaInfo": {"MaximumEfaInterfaces": 32},
            "EncryptionInTransitSupported": True,
            "EnaSrdSupported": True,
        },
        "GpuInfo": {
            "Gpus": [{"Name": "H100", "Manufacturer": "NVIDIA", "Count": 8, "MemoryInfo": {"SizeInMiB": 81920}}],
            "TotalGpuMemoryInMiB": 655360,
        },
        "PlacementGroupInfo": {"SupportedStrategies": ["cluster", "partition", "spread"]},
        "HibernationSupported": False,
        "BurstablePerformanceSupported": False,
        "DedicatedHostsSupported": True,
        "AutoRecoverySupported": False,
        "SupportedBootModes": ["legacy-bios", "uefi"],
        "NitroEnclavesSupport": "supported",
        "NitroTpmSupport": "supported",
        "PhcSupport": "supported",
    }


def g6_xlarge() -> dict[str, Any]:
    return {
        "InstanceType": "g6.xlarge",
        "CurrentGeneration": True,
        "SupportedUsageClasses": ["on-demand", "spot"],
        "VCpuInfo": {"DefaultVCpus": 4, "DefaultCores": 2, "DefaultThreadsPerCore": 2},
        "MemoryInfo": {"SizeInMiB": 16384},
        "InstanceStorageSupported": True,
        "InstanceStorageInfo": {
            "TotalSizeInGB": 250,
            "Disks": [{"SizeInGB": 250, "Count": 1, "Type": "ssd"}],
            "NvmeSupport": "required",
            "EncryptionSupport": "required",
        },
        "NetworkInfo": {
            "NetworkPerformance": "Up to 10 Gigabit",
            "MaximumNetworkInterfaces": 4,
            "MaximumNetworkCards": 1,
            "DefaultNetworkCardIndex": 0,
            "NetworkCards": [
                {
                    "NetworkCardIndex": 0,
                    "NetworkPerformance": "Up to 10 Gigabit",
                    "MaximumNetworkInterfaces": 4,
                    "BaselineBandwidthInGbps": 2.5,
                    "PeakBandwidthInGbps": 10.0,
                }
            ],
            "Ipv4AddressesPerInterface": 15,
            "Ipv6AddressesPerInterface": 15,
            "Ipv6Supported": True,
            "EnaSupport": "required",
            "EfaSupported": False,
            "EncryptionInTransitSupported": True,
            "EnaSrdSupported": False,
        },
        "GpuInfo": {
            "Gpus": [{"Name": "L4", "Manufacturer": "NVIDIA", "Count": 1, "MemoryInfo": {"SizeInMiB": 22888}}],
            "TotalGpuMemoryInMiB": 22888,
        },
        "PlacementGroupInfo": {"SupportedStrategies": ["cluster", "partition", "spread"]},
    }


def c5_xlarge() -> dict[str, Any]:
    """A type without GPUs (no GpuInfo at all)."""
    return {
        "InstanceType": "c5.xlarge",
        "SupportedUsageClasses": ["on-demand", "spot"],
        "VCpuInfo": {"DefaultVCpus": 4},
        "MemoryInfo": {"SizeInMiB": 8192},
        "InstanceStorageSupported": False,
        "NetworkInfo": {
            "MaximumNetworkCards": 1,
            "EfaSupported": False,
            "NetworkCards": [{"NetworkCardIndex": 0, "MaximumNetworkInterfaces": 4}],
        },
        "PlacementGroupInfo": {"SupportedStrategies": ["cluster", "partition", "spread"]},
    }


def price_list_entry(instance_type: str, usd: str, *, region: str = "us-east-1", usagetype: str | None = None) -> str:
    sku = "ABCDEFGHJKLMNPQR"
    document = {
        "product": {
            "productFamily": "Compute Instance",
            "attributes": {
                "instanceType": instance_type,
                "regionCode": region,
                "location": "US East (N. Virginia)",
                "locationType": "AWS Region",
                "tenancy": "Shared",
                "operatingSystem": "Linux",
                "preInstalledSw": "NA",
                "capacitystatus": "Used",
                "licenseModel": "No License required",
                "marketoption": "OnDemand",
                "operation": "RunInstances",
                "usagetype": usagetype or f"BoxUsage:{instance_type}",
                "servicecode": "AmazonEC2",
            },
            "sku": sku,
        },
        "serviceCode": "AmazonEC2",
        "terms": {
            "OnDemand": {
                f"{sku}.JRTCKXETXF": {
                    "priceDimensions": {
                        f"{sku}.JRTCKXETXF.6YS6EN2CT7": {
                            "unit": "Hrs",
                            "endRange": "Inf",
                            "description": f"${usd} per On Demand Linux {instance_type} Instance Hour",
                            "appliesTo": [],
                            "rateCode": f"{sku}.JRTCKXETXF.6YS6EN2CT7",
                            "beginRange": "0",
                            "pricePerUnit": {"USD": usd},
                        }
                    },
                    "sku": sku,
                    "effectiveDate": "2026-11-01T00:00:00Z",
                    "offerTermCode": "JRTCKXETXF",
                    "termAttributes": {},
                }
            },
            "Reserved": {
                f"{sku}.4NA7Y494T4": {
                    "priceDimensions": {
                        f"{sku}.4NA7Y494T4.6YS6EN2CT7": {
                            "unit": "Hrs",
                            "description": "Linux reserved",
                            "pricePerUnit": {"USD": "1.0000000000"},
                            "rateCode": f"{sku}.4NA7Y494T4.6YS6EN2CT7",
                            "appliesTo": [],
                            "beginRange": "0",
                            "endRange": "Inf",
                        }
                    },
                    "sku": sku,
                    "effectiveDate": "2026-11-01T00:00:00Z",
                    "offerTermCode": "4NA7Y494T4",
                    "termAttributes": {
                        "LeaseContractLength": "1yr",
                        "OfferingClass": "standard",
                        "PurchaseOption": "No Upfront",
                    },
                }
            },
        },
        "version": "20261101000000",
        "publicationDate": "2026-11-01T00:00:00Z",
    }
    return json.dumps(document)


def spot_entry(instance_type: str, az: str, price: str, minutes_ago: int, now: datetime.datetime) -> dict[str, Any]:
    return {
        "AvailabilityZone": az,
        "InstanceType": instance_type,
        "ProductDescription": "Linux/UNIX",
        "SpotPrice": price,
        "Timestamp": now - datetime.timedelta(minutes=minutes_ago),
    }
