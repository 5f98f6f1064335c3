"""Pulumi type tokens of the AWS resources the policies inspect (pulumi-aws 7.x)."""

from __future__ import annotations

LAUNCH_TEMPLATE = "aws:ec2/launchTemplate:LaunchTemplate"
INSTANCE = "aws:ec2/instance:Instance"
SUBNET = "aws:ec2/subnet:Subnet"
SECURITY_GROUP = "aws:ec2/securityGroup:SecurityGroup"
SECURITY_GROUP_RULE = "aws:ec2/securityGroupRule:SecurityGroupRule"
VPC_INGRESS_RULE = "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"
VPC_EGRESS_RULE = "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule"
AUTOSCALING_GROUP = "aws:autoscaling/group:Group"
IMAGE_BUILDER_INFRASTRUCTURE = "aws:imagebuilder/infrastructureConfiguration:InfrastructureConfiguration"
IMAGE_RECIPE = "aws:imagebuilder/imageRecipe:ImageRecipe"

S3_BUCKETS = frozenset({"aws:s3/bucket:Bucket", "aws:s3/bucketV2:BucketV2"})
S3_BUCKET_ENCRYPTION = frozenset(
    {
        "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration",
        "aws:s3/bucketServerSideEncryptionConfigurationV2:BucketServerSideEncryptionConfigurationV2",
    }
)
S3_PUBLIC_ACCESS_BLOCK = "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock"
S3_BUCKET_POLICY = "aws:s3/bucketPolicy:BucketPolicy"
EBS_VOLUME = "aws:ebs/volume:Volume"
FSX_LUSTRE = "aws:fsx/lustreFileSystem:LustreFileSystem"
DYNAMODB_TABLE = "aws:dynamodb/table:Table"
SQS_QUEUE = "aws:sqs/queue:Queue"
SQS_QUEUE_POLICY = "aws:sqs/queuePolicy:QueuePolicy"
EVENT_TARGET = "aws:cloudwatch/eventTarget:EventTarget"
SNS_TOPIC = "aws:sns/topic:Topic"
SNS_TOPIC_POLICY = "aws:sns/topicPolicy:TopicPolicy"

IAM_POLICY = "aws:iam/policy:Policy"
IAM_ROLE = "aws:iam/role:Role"
IAM_ROLE_POLICY_ATTACHMENT = "aws:iam/rolePolicyAttachment:RolePolicyAttachment"
# identity policies whose `policy` property is one JSON policy document
IAM_POLICY_DOCUMENT_HOLDERS = frozenset(
    {
        IAM_POLICY,
        "aws:iam/rolePolicy:RolePolicy",
        "aws:iam/userPolicy:UserPolicy",
        "aws:iam/groupPolicy:GroupPolicy",
    }
)
