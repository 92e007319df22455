package store

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/ratelimit"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/aws/smithy-go"
)

// S3 is a Store on an S3 bucket (AWS or any S3-compatible endpoint).
type S3 struct {
	client *s3.Client
	bucket string
	prefix string // "" or ends with "/"
	sse    types.ServerSideEncryption
	kmsKey string
	cfg    S3Config
}

// NewS3 builds the client from cfg (validated first). Without static keys the standard AWS
// credential chain is used; nothing is contacted until the first request.
func NewS3(ctx context.Context, cfg S3Config) (*S3, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	opts := []func(*config.LoadOptions) error{
		config.WithRequestChecksumCalculation(aws.RequestChecksumCalculationWhenRequired),
		config.WithResponseChecksumValidation(aws.ResponseChecksumValidationWhenRequired),
	}
	region := cfg.Region
	if region == "" && cfg.Endpoint != "" {
		region = "us-east-1" // custom endpoints rarely care; avoids an IMDS region lookup
	}
	if region != "" {
		opts = append(opts, config.WithRegion(region))
	}
	if cfg.AccessKeyID != "" {
		opts = append(opts, config.WithCredentialsProvider(
			credentials.NewStaticCredentialsProvider(cfg.AccessKeyID, cfg.SecretAccessKey, cfg.SessionToken)))
	}
	// No client-side retry quota: after an outage the store must be used again at once
	// (the flusher has its own backoff).
	opts = append(opts, config.WithRetryer(func() aws.Retryer {
		return retry.NewStandard(func(o *retry.StandardOptions) {
			o.RateLimiter = ratelimit.None
			if cfg.MaxRetries > 0 {
				o.MaxAttempts = cfg.MaxRetries + 1
			}
		})
	}))
	awsCfg, err := config.LoadDefaultConfig(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("storage.cold.s3: loading AWS configuration: %w", err)
	}
	pathStyle := cfg.Endpoint != ""
	if cfg.ForcePathStyle != nil {
		pathStyle = *cfg.ForcePathStyle
	}
	client := s3.NewFromConfig(awsCfg, func(o *s3.Options) {
		if cfg.Endpoint != "" {
			o.BaseEndpoint = aws.String(cfg.Endpoint)
		}
		o.UsePathStyle = pathStyle
	})
	st := &S3{client: client, bucket: cfg.Bucket, prefix: cleanPrefix(cfg.Prefix), kmsKey: cfg.KMSKeyID, cfg: cfg}
	switch strings.ToLower(cfg.ServerSideEncryption) {
	case "", "aes256":
		st.sse = types.ServerSideEncryptionAes256
	case "aws-kms":
		st.sse = types.ServerSideEncryptionAwsKms
	case "none":
	}
	return st, nil
}

func cleanPrefix(p string) string {
	p = strings.Trim(p, "/")
	if p == "" {
		return ""
	}
	return p + "/"
}

// Name implements Store.
func (s *S3) Name() string { return "s3" }

// Client returns the underlying client (tests create buckets with it).
func (s *S3) Client() *s3.Client { return s.client }

func (s *S3) full(key string) string { return s.prefix + key }

func (s *S3) opCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	if s.cfg.Timeout > 0 {
		return context.WithTimeout(ctx, s.cfg.Timeout.D())
	}
	return ctx, func() {}
}

// Put implements Store. A body that cannot seek is sent from memory (SigV4 over plain HTTP
// needs the payload hash up front): whole when it is small, else as a multipart upload of
// s3PartSize pieces, so a 1 GiB assembled snapshot never sits in memory.
func (s *S3) Put(ctx context.Context, key string, body io.Reader, size int64) error {
	rs, ok := body.(io.ReadSeeker)
	if !ok && size > s3PartSize {
		return s.putMultipart(ctx, key, body, size)
	}
	if !ok {
		buf := make([]byte, size)
		if _, err := io.ReadFull(body, buf); err != nil {
			return fmt.Errorf("coldstore s3: put %s: reading body: %w", key, err)
		}
		rs = bytes.NewReader(buf)
	}
	in := &s3.PutObjectInput{
		Bucket:        aws.String(s.bucket),
		Key:           aws.String(s.full(key)),
		Body:          rs,
		ContentLength: aws.Int64(size),
	}
	in.ServerSideEncryption, in.SSEKMSKeyId = s.encryption()
	ctx, cancel := s.opCtx(ctx)
	defer cancel()
	if _, err := s.client.PutObject(ctx, in); err != nil {
		return fmt.Errorf("coldstore s3: put %s: %w", key, err)
	}
	return nil
}

// GetRange implements Store.
func (s *S3) GetRange(ctx context.Context, key string, off, n int64) (io.ReadCloser, error) {
	if n == 0 {
		return io.NopCloser(bytes.NewReader(nil)), nil
	}
	rng := fmt.Sprintf("bytes=%d-", off)
	if n > 0 {
		rng = fmt.Sprintf("bytes=%d-%d", off, off+n-1)
	}
	out, err := s.client.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(s.bucket), Key: aws.String(s.full(key)), Range: aws.String(rng)})
	if err != nil {
		if isNotFound(err) {
			return nil, fmt.Errorf("%w: %s", ErrNotFound, key)
		}
		if isInvalidRange(err) {
			return io.NopCloser(bytes.NewReader(nil)), nil
		}
		return nil, fmt.Errorf("coldstore s3: get %s: %w", key, err)
	}
	return out.Body, nil
}

// Head implements Store.
func (s *S3) Head(ctx context.Context, key string) (ObjectInfo, error) {
	ctx, cancel := s.opCtx(ctx)
	defer cancel()
	out, err := s.client.HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String(s.bucket), Key: aws.String(s.full(key))})
	if err != nil {
		if isNotFound(err) {
			return ObjectInfo{}, fmt.Errorf("%w: %s", ErrNotFound, key)
		}
		return ObjectInfo{}, fmt.Errorf("coldstore s3: head %s: %w", key, err)
	}
	info := ObjectInfo{Key: key, Size: aws.ToInt64(out.ContentLength)}
	if out.LastModified != nil {
		info.ModTime = *out.LastModified
	}
	return info, nil
}

// Delete implements Store.
func (s *S3) Delete(ctx context.Context, key string) error {
	ctx, cancel := s.opCtx(ctx)
	defer cancel()
	_, err := s.client.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: aws.String(s.bucket), Key: aws.String(s.full(key))})
	if err != nil && !isNotFound(err) {
		return fmt.Errorf("coldstore s3: delete %s: %w", key, err)
	}
	return nil
}

// List implements Store.
func (s *S3) List(ctx context.Context, prefix string, fn func(ObjectInfo) bool) error {
	p := s3.NewListObjectsV2Paginator(s.client, &s3.ListObjectsV2Input{Bucket: aws.String(s.bucket), Prefix: aws.String(s.full(prefix))})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			return fmt.Errorf("coldstore s3: list %s: %w", prefix, err)
		}
		for _, o := range page.Contents {
			info := ObjectInfo{Key: strings.TrimPrefix(aws.ToString(o.Key), s.prefix), Size: aws.ToInt64(o.Size)}
			if o.LastModified != nil {
				info.ModTime = *o.LastModified
			}
			if !fn(info) {
				return nil
			}
		}
	}
	return nil
}

// CreateBucket creates the configured bucket (tests and first-run setups).
func (s *S3) CreateBucket(ctx context.Context) error {
	_, err := s.client.CreateBucket(ctx, &s3.CreateBucketInput{Bucket: aws.String(s.bucket)})
	var owned *types.BucketAlreadyOwnedByYou
	if err != nil && !errors.As(err, &owned) {
		return fmt.Errorf("coldstore s3: create bucket %s: %w", s.bucket, err)
	}
	return nil
}

func isNotFound(err error) bool {
	var nsk *types.NoSuchKey
	var nf *types.NotFound
	if errors.As(err, &nsk) || errors.As(err, &nf) {
		return true
	}
	var ae smithy.APIError
	if errors.As(err, &ae) {
		switch ae.ErrorCode() {
		case "NoSuchKey", "NotFound":
			return true
		}
	}
	return httpStatus(err) == http.StatusNotFound
}

func isInvalidRange(err error) bool {
	var ae smithy.APIError
	if errors.As(err, &ae) && ae.ErrorCode() == "InvalidRange" {
		return true
	}
	return httpStatus(err) == http.StatusRequestedRangeNotSatisfiable
}

func httpStatus(err error) int {
	var re interface{ HTTPStatusCode() int }
	if errors.As(err, &re) {
		return re.HTTPStatusCode()
	}
	return 0
}

var _ = time.Second
