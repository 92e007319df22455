package store

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
)

// s3PartSize is the piece size of a multipart upload (S3 wants at least 5 MiB but the last),
// and s3PartsInFlight how many pieces upload at once: memory is bounded by their product.
const (
	s3PartSize      = 16 << 20
	s3PartsInFlight = 2
)

// encryption returns the server-side encryption fields of a write.
func (s *S3) encryption() (types.ServerSideEncryption, *string) {
	if s.sse == types.ServerSideEncryptionAwsKms && s.kmsKey != "" {
		return s.sse, aws.String(s.kmsKey)
	}
	return s.sse, nil
}

// putMultipart writes a body that cannot seek as a multipart upload; the object appears
// whole at CompleteMultipartUpload (atomic like PutObject), and a failed upload is aborted.
func (s *S3) putMultipart(ctx context.Context, key string, body io.Reader, size int64) (err error) {
	full := s.full(key)
	in := &s3.CreateMultipartUploadInput{Bucket: aws.String(s.bucket), Key: aws.String(full)}
	in.ServerSideEncryption, in.SSEKMSKeyId = s.encryption()
	octx, cancel := s.opCtx(ctx)
	up, err := s.client.CreateMultipartUpload(octx, in)
	cancel()
	if err != nil {
		return fmt.Errorf("coldstore s3: put %s: starting the multipart upload: %w", key, err)
	}
	defer func() {
		if err != nil {
			actx, cancel := context.WithTimeout(context.Background(), s.abortTimeout())
			defer cancel()
			s.client.AbortMultipartUpload(actx, &s3.AbortMultipartUploadInput{Bucket: aws.String(s.bucket), Key: aws.String(full), UploadId: up.UploadId})
		}
	}()
	n := int((size + s3PartSize - 1) / s3PartSize)
	parts := make([]types.CompletedPart, n)
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		upErr   error
		slots   = make(chan []byte, s3PartsInFlight)
		sent    int64
		readErr error
	)
	for i := 0; i < s3PartsInFlight; i++ {
		slots <- make([]byte, s3PartSize)
	}
	for i := 0; i < n; i++ {
		buf := <-slots
		m := min(int64(s3PartSize), size-sent)
		if _, readErr = io.ReadFull(body, buf[:m]); readErr != nil {
			readErr = fmt.Errorf("coldstore s3: put %s: reading body: %w", key, readErr)
			break
		}
		sent += m
		mu.Lock()
		failed := upErr != nil
		mu.Unlock()
		if failed {
			break
		}
		wg.Add(1)
		go func(i int, piece []byte) {
			defer wg.Done()
			defer func() { slots <- buf }()
			octx, cancel := s.opCtx(ctx)
			defer cancel()
			out, err := s.client.UploadPart(octx, &s3.UploadPartInput{Bucket: aws.String(s.bucket), Key: aws.String(full), UploadId: up.UploadId,
				PartNumber: aws.Int32(int32(i + 1)), Body: bytes.NewReader(piece), ContentLength: aws.Int64(int64(len(piece)))})
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				if upErr == nil {
					upErr = fmt.Errorf("coldstore s3: put %s: part %d: %w", key, i+1, err)
				}
				return
			}
			parts[i] = types.CompletedPart{ETag: out.ETag, PartNumber: aws.Int32(int32(i + 1))}
		}(i, buf[:m])
	}
	wg.Wait()
	if readErr != nil {
		return readErr
	}
	if upErr != nil {
		return upErr
	}
	if extra, _ := body.Read(make([]byte, 1)); extra > 0 {
		return fmt.Errorf("coldstore s3: put %s: body is longer than %d bytes", key, size)
	}
	octx, cancel = s.opCtx(ctx)
	defer cancel()
	if _, err := s.client.CompleteMultipartUpload(octx, &s3.CompleteMultipartUploadInput{Bucket: aws.String(s.bucket), Key: aws.String(full),
		UploadId: up.UploadId, MultipartUpload: &types.CompletedMultipartUpload{Parts: parts}}); err != nil {
		return fmt.Errorf("coldstore s3: put %s: completing the multipart upload: %w", key, err)
	}
	return nil
}

func (s *S3) abortTimeout() time.Duration {
	if s.cfg.Timeout > 0 {
		return s.cfg.Timeout.D()
	}
	return time.Minute
}
