"""The AWS job queue: SQS slot messages + a DynamoDB job table (``backend.AwsQueue``), its pure parts beside it."""
