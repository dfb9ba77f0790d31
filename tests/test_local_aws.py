from jobs.local_aws import LocalAWS


def test_moto_server_serves_s3_and_keeps_its_port_across_restart(tmp_path):
    aws = LocalAWS(log_path=tmp_path / "moto.log").start()
    try:
        s3 = aws.client("s3")
        s3.create_bucket(Bucket="ckpt")
        assert [b["Name"] for b in s3.list_buckets()["Buckets"]] == ["ckpt"]
        port = aws.port
        aws.stop()
        aws.start()
        assert aws.port == port
        assert s3.list_buckets()["Buckets"] == []  # a restarted moto_server starts empty
    finally:
        aws.stop()
